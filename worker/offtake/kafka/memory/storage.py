"""The memory broker's topics: one append-only list of records per partition.

Owns topic creation and growth, the default partitioner and appends. It has no lock of its
own: every method runs with the broker lock held (the :class:`~.cluster.Cluster` condition),
and the caller notifies waiting clients after a change.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable

from confluent_kafka import KafkaError

from .errors import raise_kafka
from .messages import Entry

PartitionLog = list[Entry]


class TopicStore:
    """Topic name -> partition logs; a record's offset is its index in its partition's log."""

    def __init__(self) -> None:
        self._topics: dict[str, list[PartitionLog]] = {}
        self._round_robin: dict[str, int] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._topics

    def names(self) -> list[str]:
        return sorted(self._topics)

    def counts(self) -> dict[str, int]:
        """Topic names and their partition counts, in creation order."""
        return {name: len(parts) for name, parts in self._topics.items()}

    def get(self, name: str) -> list[PartitionLog] | None:
        return self._topics.get(name)

    def partitions(self, name: str) -> list[PartitionLog]:
        """The partition logs of a topic that must exist (a KeyError naming it otherwise)."""
        parts = self._topics.get(name)
        if parts is None:
            raise KeyError(
                f"no topic {name!r} in the memory broker (topics: {sorted(self._topics)})"
            )
        return parts

    def log(self, topic: str, partition: int) -> PartitionLog | None:
        """A partition's log, None when the topic or partition does not exist."""
        parts = self._topics.get(topic)
        if parts is None or partition >= len(parts):
            return None
        return parts[partition]

    def high_watermark(self, topic: str, partition: int) -> int:
        log_ = self.log(topic, partition)
        return len(log_) if log_ is not None else 0

    def create(self, name: str, partitions: int) -> None:
        self._topics[name] = [[] for _ in range(partitions)]

    def grow(self, name: str, total: int) -> None:
        parts = self.partitions(name)
        if total < len(parts):
            raise ValueError(
                f"topic {name!r} has {len(parts)} partitions; Kafka cannot remove partitions"
            )
        parts.extend([] for _ in range(total - len(parts)))

    def resolve(self, patterns: Iterable[str]) -> set[str]:
        """Subscription entries to existing topics; entries starting with ^ are regexes."""
        out: set[str] = set()
        for pat in patterns:
            if pat.startswith("^"):
                rx = re.compile(pat)
                out.update(t for t in self._topics if rx.search(t))
            elif pat in self._topics:
                out.add(pat)
        return out

    def choose_partition(self, topic: str, key: bytes | None, partition: int) -> int:
        """The partition a record goes to: the one asked for, else by key, else round robin."""
        n = len(self._topics[topic])
        if partition >= 0:
            if partition >= n:
                raise_kafka(
                    KafkaError._UNKNOWN_PARTITION,
                    f"Local: Unknown partition: {topic} has {n} partitions, not {partition + 1}",
                )
            return partition
        if key is None:
            # librdkafka's default partitioner spreads keyless records; round robin is the
            # deterministic version of that.
            i = self._round_robin.get(topic, 0)
            self._round_robin[topic] = i + 1
            return i % n
        return zlib.crc32(key) % n  # consistent_random: CRC32 of the key, as librdkafka

    def append(self, topic: str, partition: int, entry: Entry) -> int:
        """Append a record; returns its offset."""
        log_ = self._topics[topic][partition]
        log_.append(entry)
        return len(log_) - 1
