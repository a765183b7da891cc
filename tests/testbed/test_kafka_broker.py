"""The testbed's real Kafka broker: it starts, hosts topics, and keeps group offsets."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from offtake_testbed._pki import CertificateAuthority
from offtake_testbed.kafka import (
    KAFKA_VERSION,
    MTLS_LISTENER,
    SCRAM_LISTENER,
    SCRAM_TLS_LISTENER,
    TLS_LISTENER,
    KafkaBroker,
    KafkaTestbedError,
    install_kafka,
    read_topic,
)
from offtake_testbed.process import free_port
from offtake_testbed.pytest_plugin import SCRAM_USER, TopicFactory

MESSAGES = 1000
# librdkafka's retries of a refused connection, many a second: to logging (pytest keeps them
# with the test's report), not to stderr.
_quiet = logging.getLogger("tests.testbed.librdkafka")


def test_cached_install_is_complete_and_not_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    install_kafka()  # may be the cold install when this test runs first

    def resolve_again(*args: object) -> None:
        raise AssertionError("a cached install resolved the jars again")

    monkeypatch.setattr("offtake_testbed.kafka.install._resolve_with_maven", resolve_again)
    libs = install_kafka()
    assert (libs / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file()
    assert any(p.name.startswith("log4j-slf4j") for p in libs.iterdir())


def test_cli_install_prints_the_libs_folder() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "offtake_testbed.kafka", "install"],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    assert done.stdout.strip() == str(install_kafka())


def test_broker_answers_metadata_on_loopback(kafka_broker: KafkaBroker) -> None:
    assert kafka_broker.is_running()
    assert kafka_broker.bootstrap == f"127.0.0.1:{kafka_broker.port}"
    metadata = kafka_broker.admin().list_topics(timeout=10)
    assert list(metadata.brokers) == [1]
    assert metadata.brokers[1].port == kafka_broker.port


def test_context_manager_takes_a_port_and_cleans_up() -> None:
    port = free_port()
    with KafkaBroker(port=port) as broker:
        assert broker.bootstrap == f"127.0.0.1:{port}"
        assert broker.admin().list_topics(timeout=10).brokers[1].port == port
        workdir = broker.workdir
        assert (workdir / "server.log").stat().st_size > 0
    assert not broker.is_running()
    assert not workdir.exists()


def test_topic_factory_creates_twelve_led_partitions(
    kafka_broker: KafkaBroker, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=12)
    partitions = kafka_broker.admin().list_topics(topic, timeout=10).topics[topic].partitions
    assert sorted(partitions) == list(range(12))
    assert all(p.leader == 1 for p in partitions.values())


def test_delete_topic_removes_it(kafka_broker: KafkaBroker) -> None:
    name = f"to-delete-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(name, partitions=3)
    kafka_broker.delete_topic(name)
    assert name not in kafka_broker.admin().list_topics(timeout=10).topics


def test_auto_topic_creation_is_off(kafka_broker: KafkaBroker) -> None:
    # The worker must never create topics by accident; the broker is configured to refuse.
    name = f"never-created-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "message.timeout.ms": 1000})
    producer.produce(name, b"x")
    producer.flush(5)
    assert name not in kafka_broker.admin().list_topics(timeout=10).topics


def test_produce_consume_and_commit_in_a_group(
    kafka_broker: KafkaBroker, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=12)
    sent = _produce(kafka_broker.bootstrap, topic, MESSAGES)
    group = f"group-{uuid.uuid4().hex[:8]}"

    received = _consume_and_commit(kafka_broker.bootstrap, topic, group, MESSAGES)

    assert sorted(received) == sorted(sent)
    committed = _committed_offsets(kafka_broker, group)
    assert committed == _high_watermarks(kafka_broker.bootstrap, topic, 12)
    assert sum(committed.values()) == MESSAGES


def test_read_topic_right_after_a_commit_sees_the_transaction(
    kafka_broker: KafkaBroker, topic_factory: TopicFactory
) -> None:
    """The commit's markers land a moment after commit_transaction returns: the read waits."""
    topic = topic_factory(partitions=3)
    producer = Producer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "transactional.id": f"read-topic-{uuid.uuid4().hex}",
            "logger": _quiet,
        }
    )
    producer.init_transactions(60)
    for round_ in range(3):
        producer.begin_transaction()
        for i in range(12):
            producer.produce(topic, f"{round_}-{i}".encode(), partition=i % 3)
        producer.commit_transaction(60)

        seen = sorted(m.value() or b"" for m in read_topic(kafka_broker.bootstrap, topic))

        assert seen == sorted(f"{r}-{i}".encode() for r in range(round_ + 1) for i in range(12))


def test_read_topic_names_where_it_stopped_at_an_open_transaction(
    kafka_broker: KafkaBroker, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=1)
    producer = Producer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "transactional.id": f"read-topic-{uuid.uuid4().hex}",
            "logger": _quiet,
        }
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic, b"open", partition=0)
    assert producer.flush(30) == 0

    with pytest.raises(KafkaTestbedError, match=r"read 0 record\(s\); partition 0 at"):
        read_topic(kafka_broker.bootstrap, topic, timeout=3)
    assert [
        m.value() for m in read_topic(kafka_broker.bootstrap, topic, isolation="read_uncommitted")
    ] == [b"open"]
    producer.abort_transaction(60)


def _produce(bootstrap: str, topic: str, count: int) -> list[bytes]:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    errors: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    values = [f"value-{i}".encode() for i in range(count)]
    for i, value in enumerate(values):
        producer.produce(topic, value, key=f"key-{i}".encode(), on_delivery=on_delivery)
    assert producer.flush(30) == 0, "messages still in flight after 30 s"
    assert errors == []
    return values


def _consume_and_commit(bootstrap: str, topic: str, group: str, expected: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
        }
    )
    received: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(received) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=500, timeout=1.0):
                assert msg.error() is None, msg.error()
                value = msg.value()
                assert isinstance(value, bytes)
                received.append(value)
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return received


def _committed_offsets(broker: KafkaBroker, group: str) -> dict[int, int]:
    request = [ConsumerGroupTopicPartitions(group)]
    result = broker.admin().list_consumer_group_offsets(request)[group].result(timeout=30)
    return {tp.partition: tp.offset for tp in result.topic_partitions}


def _high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def test_a_cluster_id_starting_with_a_dash_is_not_taken_for_an_option(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import base64

    import offtake_testbed.kafka.jvm as testbed_kafka

    real = base64.urlsafe_b64encode
    monkeypatch.setattr(testbed_kafka.base64, "urlsafe_b64encode", lambda raw: b"-" + real(raw)[1:])
    with KafkaBroker() as broker:
        assert broker.admin().list_topics(timeout=10).brokers


# ------------------------------------------------------------------ the secured listeners


def _metadata_errors(conf: dict[str, str]) -> tuple[set[str], list[KafkaError]]:
    """The topics a client of ``conf`` sees, and the errors its error_cb got meanwhile."""
    errors: list[KafkaError] = []
    client = AdminClient({**conf, "error_cb": errors.append, "logger": _quiet})
    try:
        return set(client.list_topics(timeout=10).topics), errors
    except KafkaException:
        client.poll(1)
        return set(), errors


def test_the_default_broker_has_only_its_plain_listener(kafka_broker: KafkaBroker) -> None:
    props = (kafka_broker.workdir / "server.properties").read_text()
    assert f"listeners=PLAINTEXT://127.0.0.1:{kafka_broker.port},CONTROLLER://" in props
    assert "sasl" not in props and "ssl" not in props
    with pytest.raises(KafkaTestbedError, match="no SCRAM listener"):
        kafka_broker.listener_bootstrap(SCRAM_LISTENER)


def test_each_secured_listener_serves_a_client_with_the_right_credentials(
    secured_kafka_broker: KafkaBroker,
) -> None:
    broker = secured_kafka_broker
    topic = f"secured-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic)  # through the plain listener
    client = broker.client_certificate()
    clients = {
        SCRAM_LISTENER: {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": SCRAM_USER,
            "sasl.password": broker.scram_users[SCRAM_USER],
        },
        SCRAM_TLS_LISTENER: {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": SCRAM_USER,
            "sasl.password": broker.scram_users[SCRAM_USER],
            "ssl.ca.pem": broker.ca_pem,
        },
        TLS_LISTENER: {"security.protocol": "SSL", "ssl.ca.pem": broker.ca_pem},
        MTLS_LISTENER: {
            "security.protocol": "SSL",
            "ssl.ca.pem": broker.ca_pem,
            "ssl.certificate.pem": client.cert_pem,
            "ssl.key.pem": client.key_pem,
        },
    }
    for listener, conf in clients.items():
        # localhost, not 127.0.0.1: the certificate's subjectAltName names both.
        bootstrap = broker.listener_bootstrap(listener).replace("127.0.0.1", "localhost")
        topics, errors = _metadata_errors({"bootstrap.servers": bootstrap, **conf})
        assert topic in topics, (listener, [e.str() for e in errors])


def test_secured_listeners_refuse_wrong_credentials(secured_kafka_broker: KafkaBroker) -> None:
    broker = secured_kafka_broker
    _, errors = _metadata_errors(
        {
            "bootstrap.servers": broker.listener_bootstrap(SCRAM_LISTENER),
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": SCRAM_USER,
            "sasl.password": "not-the-password",
        }
    )
    assert KafkaError._AUTHENTICATION in {e.code() for e in errors}
    # Another CA's certificate is not trusted, and the MTLS listener wants a client certificate.
    _, errors = _metadata_errors(
        {
            "bootstrap.servers": broker.listener_bootstrap(TLS_LISTENER),
            "security.protocol": "SSL",
            "ssl.ca.pem": CertificateAuthority("another-ca").cert_pem,
        }
    )
    assert any("certificate verify failed" in e.str() for e in errors), errors
    _, errors = _metadata_errors(
        {
            "bootstrap.servers": broker.listener_bootstrap(MTLS_LISTENER),
            "security.protocol": "SSL",
            "ssl.ca.pem": broker.ca_pem,
        }
    )
    assert any("certificate" in e.str() for e in errors), errors


def test_cli_run_refuses_a_scram_user_without_a_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from offtake_testbed.kafka.cli import main

    assert main(["run", "--scram-user", "alice"]) == 1
    assert "--scram-user 'alice': expected NAME:PASSWORD" in capsys.readouterr().err
    with pytest.raises(KafkaTestbedError, match="only A-Z a-z 0-9"):
        KafkaBroker(scram_users={"alice": "pass word"})
