"""A read-only view of a consumer group's position on its topics, for ``offtake status``.

Reads what the broker knows, without joining the group: the committed offset and log-end
offset of every partition, and the timestamp of the first uncommitted record (for lag in
seconds), read by a consumer that is assigned, never subscribed, and never commits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import confluent_kafka

from offtake.config.spec import matching_topics

TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class PartitionPosition:
    topic: str
    partition: int
    committed: int | None  # None: the group never committed on this partition
    log_start: int
    log_end: int
    oldest_uncommitted_ms: int | None  # timestamp of the record at the committed offset

    @property
    def lag(self) -> int:
        start = self.committed if self.committed is not None else self.log_start
        return max(0, self.log_end - start)

    def lag_seconds(self, now_ms: float) -> float | None:
        if self.lag == 0:
            return 0.0
        if self.oldest_uncommitted_ms is None:
            return None
        return max(0.0, (now_ms - self.oldest_uncommitted_ms) / 1000)


def group_positions(
    config: dict[str, Any], group: str, topics: list[str]
) -> list[PartitionPosition]:
    """Every partition of ``topics`` (names or ``^`` patterns) with ``group``'s committed offset
    and its lag."""
    conf = {k: v for k, v in config.items() if not callable(v)}
    conf.update({"group.id": group, "enable.auto.commit": False})
    consumer = confluent_kafka.Consumer(conf)
    try:
        metadata = consumer.list_topics(timeout=TIMEOUT)
        tps: list[Any] = []
        # A pattern stands for the topics it matches now (librdkafka's subscription rule).
        for topic in matching_topics(topics, metadata.topics):
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None:
                raise LookupError(f"topic {topic!r} not found on the brokers")
            tps += [confluent_kafka.TopicPartition(topic, p) for p in sorted(meta.partitions)]
        committed = {(p.topic, p.partition): p.offset for p in consumer.committed(tps, TIMEOUT)}
        out: list[PartitionPosition] = []
        for tp in tps:
            low, high = consumer.get_watermark_offsets(tp, timeout=TIMEOUT, cached=False)
            offset = committed.get((tp.topic, tp.partition), -1)
            start = offset if offset >= 0 else low
            oldest = None
            if start < high:
                oldest = _timestamp_at(consumer, tp.topic, tp.partition, start)
            out.append(
                PartitionPosition(
                    tp.topic, tp.partition, offset if offset >= 0 else None, low, high, oldest
                )
            )
        return out
    finally:
        consumer.close()


def _timestamp_at(consumer: Any, topic: str, partition: int, offset: int) -> int | None:
    consumer.assign([confluent_kafka.TopicPartition(topic, partition, offset)])
    try:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            for msg in consumer.consume(1, timeout=1.0):
                if msg.error() is None:
                    ts_type, ts = msg.timestamp()
                    return int(ts) if ts_type and ts >= 0 else None
        return None
    finally:
        consumer.unassign()
