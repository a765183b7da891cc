"""Which offset of each partition may be committed, when work finishes out of order.

For every assigned partition the tracker keeps the records consumed and not yet committed.
A record is *pending* until its sink (or the DLQ, or the skip policy) reports it done. The
commit position of a partition is the lowest pending offset, or one past the last consumed
offset when nothing is pending: every record below it is done, so committing it loses
nothing (at-least-once), and records done above a pending one wait for it.

Records stay counted as in flight until the broker acknowledged a commit past them, not merely
until they are done: that is what bounds the duplicates after a crash by the in-flight limit.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from offtake.records import TopicPartition


@dataclass(slots=True)
class _Partition:
    epoch: int
    # (offset, bytes, timestamp ms) in consumption order, for every record not yet committed.
    uncommitted: deque[tuple[int, int, int | None]] = field(default_factory=deque)
    pending: set[int] = field(default_factory=set)
    heap: list[int] = field(default_factory=list)  # pending offsets, lazily pruned
    next_offset: int | None = None  # one past the last consumed offset
    committed: int | None = None  # last commit position the broker acknowledged
    failed: int | None = None  # a record the stop policy gave up on: nothing past it commits


class OffsetTracker:
    """Per-partition bookkeeping of consumed, done and committed offsets."""

    def __init__(self) -> None:
        self._parts: dict[TopicPartition, _Partition] = {}
        self._epochs = 0
        self.inflight_messages = 0
        self.inflight_bytes = 0

    # -- assignment -----------------------------------------------------------------------
    def assign(self, tp: TopicPartition) -> int:
        """Start tracking a newly assigned partition; returns its epoch.

        The epoch tells work of this assignment apart from stale work of an earlier one, so
        a completion that arrives after a revoke cannot touch a later assignment's state.
        """
        self.release(tp)
        self._epochs += 1
        self._parts[tp] = _Partition(epoch=self._epochs)
        return self._epochs

    def release(self, tp: TopicPartition) -> None:
        """Forget a partition (revoked after its final commit, or lost)."""
        part = self._parts.pop(tp, None)
        if part is not None:
            for _, size, _ in part.uncommitted:
                self.inflight_messages -= 1
                self.inflight_bytes -= size

    def epoch(self, tp: TopicPartition) -> int | None:
        part = self._parts.get(tp)
        return part.epoch if part else None

    def partitions(self) -> list[TopicPartition]:
        return list(self._parts)

    # -- records ----------------------------------------------------------------------------
    def register(self, tp: TopicPartition, offset: int, size: int, timestamp: int | None) -> int:
        """A record was consumed: pending until done. Returns the partition's epoch."""
        part = self._parts.get(tp)
        if part is None:  # a record of a partition we never saw assigned: track it anyway
            self.assign(tp)
            part = self._parts[tp]
        part.uncommitted.append((offset, size, timestamp))
        part.pending.add(offset)
        heapq.heappush(part.heap, offset)
        part.next_offset = offset + 1
        self.inflight_messages += 1
        self.inflight_bytes += size
        return part.epoch

    def done(self, tp: TopicPartition, offset: int, epoch: int) -> bool:
        """A record reached its destination. False if it belongs to a stale assignment."""
        part = self._parts.get(tp)
        if part is None or part.epoch != epoch:
            return False
        part.pending.discard(offset)
        return True

    def fail(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        """The stop policy gave up on this record: never commit at or past it."""
        part = self._parts.get(tp)
        if part is not None and part.epoch == epoch:
            part.failed = offset if part.failed is None else min(part.failed, offset)
            part.pending.discard(offset)  # settled (as failed), so drains do not wait for it

    # -- commits ----------------------------------------------------------------------------
    def position(self, tp: TopicPartition) -> int | None:
        """The offset that may be committed now (all below it done), or None if nothing new."""
        part = self._parts.get(tp)
        if part is None or part.next_offset is None:
            return None
        while part.heap and part.heap[0] not in part.pending:
            heapq.heappop(part.heap)
        pos = part.heap[0] if part.heap else part.next_offset
        if part.failed is not None:
            pos = min(pos, part.failed)
        return pos

    def commit_positions(self) -> dict[TopicPartition, int]:
        """Positions that moved past the last acknowledged commit, by partition."""
        out: dict[TopicPartition, int] = {}
        for tp, part in self._parts.items():
            pos = self.position(tp)
            if pos is not None and (part.committed is None or pos > part.committed):
                out[tp] = pos
        return out

    def seed(self, tp: TopicPartition, offset: int) -> None:
        """Make a partition's start offset committable, as if consumed up to it.

        With startFrom latest, a group that never consumed a record has no committed offset;
        the next owner would reset to the then-latest offset and skip what arrived meanwhile.
        Committing the position the consumer reset to pins the start.
        """
        part = self._parts.get(tp)
        if part is not None and part.next_offset is None:
            part.next_offset = offset

    def committed(self, tp: TopicPartition, offset: int) -> None:
        """The broker acknowledged a commit at ``offset``: release records below it."""
        part = self._parts.get(tp)
        if part is None:
            return
        if part.committed is None or offset > part.committed:
            part.committed = offset
        while part.uncommitted and part.uncommitted[0][0] < offset:
            _, size, _ = part.uncommitted.popleft()
            self.inflight_messages -= 1
            self.inflight_bytes -= size

    def oldest_uncommitted(self, tp: TopicPartition) -> int | None:
        """The offset of the oldest record consumed and not yet committed, if any."""
        part = self._parts.get(tp)
        return part.uncommitted[0][0] if part is not None and part.uncommitted else None

    def last_committed(self, tp: TopicPartition) -> int | None:
        part = self._parts.get(tp)
        return part.committed if part else None

    def done_uncommitted(self) -> int:
        """Records done but not yet covered by an acknowledged commit (drives early commits)."""
        total = 0
        for part in self._parts.values():
            total += len(part.uncommitted) - len(part.pending)
        return total

    def pending_in(self, partitions: set[TopicPartition] | None = None) -> int:
        """Records still pending, in these partitions (all when None)."""
        return sum(
            len(p.pending)
            for tp, p in self._parts.items()
            if partitions is None or tp in partitions
        )

    def oldest_uncommitted_timestamp(self, tp: TopicPartition) -> int | None:
        """Timestamp (ms) of the oldest consumed record not yet committed, for lag in seconds."""
        part = self._parts.get(tp)
        if part is None or not part.uncommitted:
            return None
        return part.uncommitted[0][2]
