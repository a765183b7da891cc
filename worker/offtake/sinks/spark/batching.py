"""Per-partition bounded batches with a deterministic identity.

A batch holds consecutive items of one partition and is named by that partition and the
offset range it covers: ``topic-partition-start-end``. The name is all a writer needs to make
a rewrite idempotent: the same records written again under the same identity replace the
earlier copy instead of adding a second one.

A batch closes when it reaches ``maxRecords`` or ``maxBytes``, when ``maxIntervalSeconds`` has
passed since its first item, when the engine drains its partition, or when an item does not
follow it (a rewind or a new assignment epoch): offsets inside one batch always increase, so
the range in its name is exact.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from offtake.config.spec import SparkBatchSpec
from offtake.records import TopicPartition
from offtake.sinks.base import SinkItem


@dataclass(frozen=True, order=True)
class BatchId:
    """Identity of a batch: a topic, a partition and an inclusive offset range."""

    topic: str
    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start > self.end:
            raise ValueError(f"batch {self}: start offset {self.start} is after end {self.end}")

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}-{self.start}-{self.end}"

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @classmethod
    def parse(cls, text: str) -> BatchId:
        """Read a name made by ``str()``; topics may contain '-', so split from the right."""
        parts = text.rsplit("-", 3)
        if len(parts) != 4 or not parts[0]:
            raise ValueError(f"not a batch id (topic-partition-start-end): {text!r}")
        topic, partition, start, end = parts
        try:
            return cls(topic, int(partition), int(start), int(end))
        except ValueError as exc:
            raise ValueError(f"not a batch id (topic-partition-start-end): {text!r}") from exc

    def supersedes(self, other: BatchId) -> bool:
        """True if writing this batch must replace ``other``: same partition, and ``other``
        starts inside this batch's range.

        After a crash the worker resumes at the committed offset, which is where an earlier
        uncommitted batch started; its new batches, written in order, start at or before every
        earlier batch they overlap. A batch that starts *before* this one was not replayed from
        its start (a rewind into its middle): replacing it would lose its rows below this
        batch's start, which may be committed, so it is kept (its rows may then appear twice).
        """
        return self.tp == other.tp and self.start <= other.start <= self.end


@dataclass
class Batch:
    """Items of one partition collected for one Spark job."""

    tp: TopicPartition
    epoch: int
    opened_at: float
    items: list[SinkItem] = field(default_factory=list)
    nbytes: int = 0
    # Set when the engine gives the partition up: the job must not swap this batch in.
    abandoned: bool = False

    @property
    def id(self) -> BatchId:
        if not self.items:
            raise ValueError(f"batch of {self.tp} has no items, so no offset range")
        return BatchId(
            self.tp.topic,
            self.tp.partition,
            self.items[0].record.offset,
            self.items[-1].record.offset,
        )

    @property
    def rows(self) -> int:
        """Rows this batch writes: one per value (an item may carry none or several)."""
        return sum(len(item.values) for item in self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        ident = str(self.id) if self.items else f"{self.tp} (empty)"
        return f"Batch({ident}, items={len(self.items)}, bytes={self.nbytes})"


def item_size(item: SinkItem) -> int:
    """Bytes an item counts against ``maxBytes``: the source record's in-memory size."""
    return item.record.size


class Batcher:
    """Open batches, one per partition; closing hands a batch over for its job.

    Not thread-safe on its own: the sink calls it under its lock.
    """

    def __init__(self, bounds: SparkBatchSpec, clock: Callable[[], float] = time.monotonic) -> None:
        self.bounds = bounds
        self.clock = clock
        self._open: dict[TopicPartition, Batch] = {}

    def add(self, item: SinkItem) -> list[Batch]:
        """Append an item to its partition's batch; return the batches this closed."""
        closed: list[Batch] = []
        tp = item.tp
        batch = self._open.get(tp)
        if batch is not None and not _follows(batch, item):
            closed.append(self._open.pop(tp))
            batch = None
        if batch is None:
            batch = self._open[tp] = Batch(tp, item.epoch, self.clock())
        batch.items.append(item)
        batch.nbytes += item_size(item)
        if len(batch.items) >= self.bounds.max_records or batch.nbytes >= self.bounds.max_bytes:
            closed.append(self._open.pop(tp))
        return closed

    def due(self) -> list[Batch]:
        """Close and return the batches open for ``maxIntervalSeconds`` or longer."""
        now = self.clock()
        limit = self.bounds.max_interval_seconds
        expired = [tp for tp, b in self._open.items() if now - b.opened_at >= limit]
        return [self._open.pop(tp) for tp in expired]

    def close(self, partitions: Collection[TopicPartition] | None) -> list[Batch]:
        """Close the open batches of these partitions (all when None) now."""
        tps = (
            list(self._open)
            if partitions is None
            else [tp for tp in partitions if tp in self._open]
        )
        return [self._open.pop(tp) for tp in tps]


def _follows(batch: Batch, item: SinkItem) -> bool:
    """True if the item may join the batch: same epoch and a higher offset than its last."""
    return item.epoch == batch.epoch and item.record.offset > batch.items[-1].record.offset
