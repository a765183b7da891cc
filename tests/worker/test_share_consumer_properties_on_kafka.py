"""librdkafka itself (the version confluent-kafka bundles) against Offtake's list of what a
share consumer refuses (offtake.config.client_properties.SHARE_REFUSED): a real ShareConsumer
on the test bed's Kafka, created with each property, must be refused naming it. Should a
librdkafka release start taking one, or refuse one more, this fails and the list (with the CRD
rule made from it) is corrected. SHARE_IGNORED holds what librdkafka takes and documents as
ignored for share consumers: taken here, so it is not in the wrong list."""

from __future__ import annotations

from typing import Any

import confluent_kafka
import pytest

from offtake.config.client_properties import SHARE_IGNORED, SHARE_REFUSED
from offtake_testbed.kafka import KafkaBroker

#: A value each property's type accepts (a refusal must be about the property, not its value).
VALUES = {
    "session.timeout.ms": "6000",
    "heartbeat.interval.ms": "500",
    "group.protocol": "consumer",
    "group.protocol.type": "consumer",
    "partition.assignment.strategy": "range",
    "group.remote.assignor": "uniform",
    "group.instance.id": "worker-0",
    "enable.auto.commit": "false",
    "isolation.level": "read_committed",
    "auto.offset.reset": "earliest",
    "queued.min.messages": "1000",
    "queued.max.messages.kbytes": "1024",
    "fetch.queue.backoff.ms": "10",
    "fetch.error.backoff.ms": "100",
    "enable.partition.eof": "true",
    "message.copy.max.bytes": "1024",
    "topic.blacklist": "^internal",
    "allow.auto.create.topics": "true",
    "consume.callback.max.messages": "10",
    "socket.max.fails": "3",
    "auto.commit.interval.ms": "1000",
    "fetch.message.max.bytes": "65536",
    "max.partition.fetch.bytes": "65536",
    "max.in.flight.requests.per.connection": "5",
}


def share_consumer(bootstrap: str, **extra: str) -> Any:
    return confluent_kafka.ShareConsumer(
        {"bootstrap.servers": bootstrap, "group.id": "offtake-properties-check", **extra}
    )


def test_every_property_has_a_value_here() -> None:
    assert set(VALUES) == {*SHARE_REFUSED, *SHARE_IGNORED}


@pytest.mark.parametrize("key", list(SHARE_REFUSED))
def test_librdkafka_refuses_it_for_a_share_consumer(kafka_broker: KafkaBroker, key: str) -> None:
    # confluent-kafka raises ValueError("Failed to create share consumer: ...") for it.
    with pytest.raises((ValueError, confluent_kafka.KafkaException)) as err:
        share_consumer(kafka_broker.bootstrap, **{key: VALUES[key]}).close()
    assert key in str(err.value), (confluent_kafka.libversion(), str(err.value))
    # The same value is a consumer's own: the refusal is the share consumer's.
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": kafka_broker.bootstrap, "group.id": "g", key: VALUES[key]}
    )
    consumer.close()


@pytest.mark.parametrize("key", list(SHARE_IGNORED))
def test_librdkafka_takes_what_it_ignores(kafka_broker: KafkaBroker, key: str) -> None:
    share_consumer(kafka_broker.bootstrap, **{key: VALUES[key]}).close()
