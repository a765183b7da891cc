"""The operator's Kafka side (lag, group membership, offset resets) against the real broker."""

from __future__ import annotations

import dataclasses
import datetime
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from offtake.config import PipelineSpec, parse_pipeline
from offtake_operator.group_offsets import GroupNotEmptyError, group_members, reset_offsets
from offtake_operator.lag import KafkaAccessError, LagReport, measure_lag, measure_lags
from offtake_operator.operator_spec import Rewind
from offtake_testbed.pytest_plugin import TopicFactory

pytestmark = [pytest.mark.timeout(300)]

HOUR_MS = 3_600_000


def spec(bootstrap: str, topic: str, group: str, start_from: str = "earliest") -> PipelineSpec:
    return parse_pipeline(
        {
            "apiVersion": "offtake.dev/v1alpha1",
            "kind": "ConsumerPipeline",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "kafka": {"bootstrapServers": bootstrap},
                "source": {"topics": [topic], "groupId": group, "startFrom": start_from},
                "sink": {"log": {}},
            },
        }
    )


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int, base_ms: int) -> None:
    """``per_partition`` records in each partition, the i-th stamped ``base_ms + i`` hours."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for p in range(partitions):
        for i in range(per_partition):
            producer.produce(topic, value=b"{}", partition=p, timestamp=base_ms + i * HOUR_MS)
    assert producer.flush(30) == 0


def commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        consumer.commit(
            offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False
        )
    finally:
        consumer.close()


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        got = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return [tp.offset for tp in got]
    finally:
        consumer.close()


def test_lag_in_messages_and_seconds(kafka_broker: Any, topic_factory: TopicFactory) -> None:
    topic = topic_factory(partitions=2)
    now_ms = int(time.time() * 1000)
    base = now_ms - 10 * HOUR_MS
    produce(kafka_broker.bootstrap, topic, 2, 5, base)  # stamps base .. base+4h per partition
    group = f"g-{uuid.uuid4().hex[:6]}"
    commit(kafka_broker.bootstrap, group, {(topic, 0): 3})  # partition 1: nothing committed

    report = measure_lag(spec(kafka_broker.bootstrap, topic, group), {}, timeout=10)
    assert report.partitions == 2
    assert report.lag == 7  # partition 0: 5 - 3, partition 1: all 5
    # The oldest uncommitted record is partition 1's first (base): about 10 hours old.
    assert report.lag_seconds == pytest.approx(10 * 3600, abs=120)

    latest = measure_lag(spec(kafka_broker.bootstrap, topic, group, "latest"), {}, timeout=10)
    assert latest.lag == 2, "startFrom latest: a partition without a commit owes nothing"


def test_a_share_group_has_no_lag_to_report(kafka_broker: Any, topic_factory: TopicFactory) -> None:
    """Queue mode: the group commits no offsets, so counting from the log start would report
    every record as lag however far the share group got; the report leaves lag out."""
    topic = topic_factory(partitions=2)
    produce(kafka_broker.bootstrap, topic, 2, 5, int(time.time() * 1000))
    queue = spec(kafka_broker.bootstrap, topic, f"g-{uuid.uuid4().hex[:6]}")
    queue = dataclasses.replace(queue, source=dataclasses.replace(queue.source, group_type="share"))
    report = measure_lag(queue, {}, timeout=10)
    assert (report.lag, report.lag_seconds, report.partitions) == (None, None, 2)


def test_lags_of_many_pipelines_in_one_round(
    kafka_broker: Any, topic_factory: TopicFactory
) -> None:
    """measure_lags: each pipeline gets what measure_lag alone would give, also several groups
    at different offsets of the same partition (one probe read per offset), and a pipeline
    whose topic is missing gets its own error without failing the others."""
    topic = topic_factory(partitions=2)
    base = int(time.time() * 1000) - 10 * HOUR_MS
    produce(kafka_broker.bootstrap, topic, 2, 5, base)
    groups = [f"g-{uuid.uuid4().hex[:6]}" for _ in range(3)]
    commit(kafka_broker.bootstrap, groups[0], {(topic, 0): 3, (topic, 1): 5})  # record 3: 7 h
    commit(kafka_broker.bootstrap, groups[1], {(topic, 0): 1, (topic, 1): 5})  # record 1: 9 h
    # groups[2]: nothing committed, earliest: all 10 records, the oldest 10 h old
    requests = [(spec(kafka_broker.bootstrap, topic, g), {}) for g in groups]
    requests.append((spec(kafka_broker.bootstrap, "no-such-topic", "g"), {}))

    reports = measure_lags(requests, timeout=10)

    assert [r.lag for r in reports[:3] if isinstance(r, LagReport)] == [2, 4, 10]
    ages = [r.lag_seconds / 3600 for r in reports[:3] if isinstance(r, LagReport)]
    assert ages == [pytest.approx(h, abs=0.05) for h in (7, 9, 10)]
    assert isinstance(reports[3], KafkaAccessError) and "no-such-topic" in str(reports[3])


def test_lag_of_an_unknown_topic_names_it(kafka_broker: Any) -> None:
    with pytest.raises(KafkaAccessError, match="no-such-topic"):
        measure_lag(spec(kafka_broker.bootstrap, "no-such-topic", "g"), {}, timeout=5)


def test_reset_offsets_waits_for_an_empty_group_then_moves_every_partition(
    kafka_broker: Any, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=3)
    base = int(time.time() * 1000) - 10 * HOUR_MS
    produce(kafka_broker.bootstrap, topic, 3, 4, base)
    group = f"g-{uuid.uuid4().hex[:6]}"
    pipeline = spec(kafka_broker.bootstrap, topic, group)

    member = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": group})
    member.subscribe([topic])
    deadline = time.monotonic() + 30
    while not member.assignment() and time.monotonic() < deadline:
        member.poll(0.2)
    assert group_members(pipeline, {}, 10) == 1
    with pytest.raises(GroupNotEmptyError, match=group):
        reset_offsets(pipeline, {}, Rewind(id="r", to="earliest"), 10)
    member.close()
    assert group_members(pipeline, {}, 10) == 0

    latest = reset_offsets(pipeline, {}, Rewind(id="r1", to="latest"), 10)
    assert latest == {(topic, p): 4 for p in range(3)}
    assert committed(kafka_broker.bootstrap, group, topic, 3) == [4, 4, 4]

    reset_offsets(pipeline, {}, Rewind(id="r2", to="earliest"), 10)
    assert committed(kafka_broker.bootstrap, group, topic, 3) == [0, 0, 0]

    # The first record at or after base + 2h30 is the fourth (base + 3h): offset 3.
    stamp = datetime.datetime.fromtimestamp(
        (base + 2 * HOUR_MS + HOUR_MS // 2) / 1000, datetime.UTC
    )
    reset_offsets(pipeline, {}, Rewind(id="r3", to="timestamp", timestamp=stamp), 10)
    assert committed(kafka_broker.bootstrap, group, topic, 3) == [3, 3, 3]

    # After the last record: the end (nothing newer to re-read).
    future = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)
    reset_offsets(pipeline, {}, Rewind(id="r4", to="timestamp", timestamp=future), 10)
    assert committed(kafka_broker.bootstrap, group, topic, 3) == [4, 4, 4]
