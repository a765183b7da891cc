"""Which offset of each partition may be committed, when work finishes out of order.

For every assigned partition the tracker keeps the records consumed and not yet committed.
A record is *pending* until it is settled: its sink settled it as written, or the error policy
dead-lettered it, skipped it, or sent it to a retry topic (:meth:`OffsetTracker.settle`,
:meth:`OffsetTracker.settle_many`). The commit position of a partition is the lowest pending
offset, or one past the last consumed offset when nothing is pending: every record below it
is settled, so committing it loses nothing (at-least-once), and records settled above a
pending one wait for it. A record the stop policy gave up on (:meth:`OffsetTracker.fail`)
caps the position for good. The delivery mode (``delivery/``: ``commits.py``'s committer, or
the sink's transaction) commits :meth:`OffsetTracker.commit_positions` and reports what the
broker acknowledged to :meth:`OffsetTracker.committed`.

Records stay counted as in flight until the broker acknowledged a commit past them, not merely
until they are settled: that is what bounds the duplicates after a crash by the in-flight
limit (``limits.maxInFlightMessages``).

Batch-first: the unit of bookkeeping is a *chunk*, the records of one partition taken from
one poll (:meth:`OffsetTracker.register_batch`), which is also what goes to the sink as one
batch. The next run of a chunk's offsets settled in order (:meth:`OffsetTracker.settle_many`,
the common case: the chunk's sink batch delivered, all of it but what failed or was dropped)
costs one update, whatever its size; a record settled on its own (dead-lettered, dropped,
retried, or delivered apart from its neighbours) marks just its offset. No object is kept per
record: a chunk holds its offsets as one list, its byte count and its first timestamp, and a
set only of the offsets settled out of order.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from offtake.records import TopicPartition


@dataclass(slots=True)
class _Chunk:
    """Records of one partition from one poll, in offset order."""

    offsets: list[int]
    size: int  # bytes of the records still in this chunk
    timestamp: int | None  # of its first record (ms), for lag in seconds
    pending: int  # records not yet settled
    head: int = 0  # offsets[:head] were settled in order, a run at a time
    settled: set[int] | None = None  # offsets from head on settled one by one

    @property
    def first(self) -> int:
        return self.offsets[0]

    def lowest_pending(self) -> int | None:
        if not self.pending:
            return None
        if not self.settled:
            return self.offsets[self.head]
        for offset in itertools.islice(self.offsets, self.head, None):
            if offset not in self.settled:
                return offset
        return None  # unreachable while pending > 0

    def settle_run(self, offsets: Sequence[int]) -> bool:
        """Settle the next run of offsets in order (this chunk's sink batch), in O(1).

        False if ``offsets`` are not exactly the next ones: then they are settled one by one.
        """
        n, head = len(offsets), self.head
        if (
            self.settled
            or not n
            or head + n > len(self.offsets)
            or self.offsets[head] != offsets[0]
            or self.offsets[head + n - 1] != offsets[-1]
        ):
            return False
        # Ascending, unique and taken from this chunk: first and last fix the whole run.
        self.head = head + n
        self.pending -= n
        return True

    def settle(self, offset: int) -> bool:
        """Settle one offset; False if it is not in this chunk or was settled already."""
        if not self.pending:
            return False
        i = bisect_left(self.offsets, offset)
        if i < self.head or i == len(self.offsets) or self.offsets[i] != offset:
            return False
        settled = self.settled
        if settled is not None and offset in settled:
            return False
        self.pending -= 1
        if i == self.head:  # next in order: move the head on, past any settled before it
            self.head += 1
            while settled and self.head < len(self.offsets) and self.offsets[self.head] in settled:
                settled.discard(self.offsets[self.head])
                self.head += 1
        elif settled is None:
            self.settled = {offset}
        else:
            settled.add(offset)
        if not self.pending:
            self.settled = None
        return True


@dataclass(slots=True)
class _Partition:
    epoch: int
    # Chunks of records not yet covered by an acknowledged commit, in consumption order.
    chunks: deque[_Chunk] = field(default_factory=deque)
    pending: int = 0  # records pending in all chunks
    next_offset: int | None = None  # one past the last consumed offset
    committed: int | None = None  # last commit position the broker acknowledged
    failed: int | None = None  # a record the stop policy gave up on: nothing past it commits

    def chunk_of(self, offset: int) -> _Chunk | None:
        # Newest first: what settles is mostly the latest work, and before it wait the chunks
        # settled since the last acknowledged commit (hundreds of small ones at a moderate
        # rate, a few records per poll). No early stop: chunks need not ascend (a share group
        # may deliver a record again while the poll that first brought it is still here).
        for chunk in reversed(self.chunks):
            if chunk.offsets[0] <= offset <= chunk.offsets[-1]:
                return chunk
        return None


class OffsetTracker:
    """Per-partition bookkeeping of consumed, settled and committed offsets."""

    def __init__(self) -> None:
        self._parts: dict[TopicPartition, _Partition] = {}
        self._epochs = 0
        self.inflight_messages = 0
        self.inflight_bytes = 0

    # -- assignment -----------------------------------------------------------------------
    def assign(self, tp: TopicPartition) -> int:
        """Start tracking a newly assigned partition; returns its epoch.

        The epoch tells work of this assignment apart from stale work of an earlier one, so
        a settlement that arrives after a revoke cannot touch a later assignment's state.
        """
        self.release(tp)
        self._epochs += 1
        self._parts[tp] = _Partition(epoch=self._epochs)
        return self._epochs

    def renew(self, tp: TopicPartition) -> int:
        """Start ``tp``'s bookkeeping again under a new epoch, keeping its last acknowledged
        commit; returns the epoch. Nothing of it stays in flight, and work of the old epoch is
        stale: its settlements are refused here, and the processing stage drops it once told
        (:meth:`Loop.assignment_changed`). For a partition still ours whose records will come
        again: an exactly-once rewind after an abort, a share group's poll given back."""
        part = self._parts.get(tp)
        committed = part.committed if part is not None else None
        epoch = self.assign(tp)
        self._parts[tp].committed = committed
        return epoch

    def acknowledged(self, tp: TopicPartition) -> None:
        """Queue mode: every record of ``tp`` consumed so far was acknowledged to the share
        group on its own, so they leave in flight; a share group has no position to commit."""
        part = self._parts.get(tp)
        if part is None:
            return
        for chunk in part.chunks:
            self.inflight_messages -= len(chunk.offsets)
            self.inflight_bytes -= chunk.size
        part.chunks.clear()
        part.pending = 0

    def release(self, tp: TopicPartition) -> None:
        """Forget a partition (revoked after its final commit, or lost)."""
        part = self._parts.pop(tp, None)
        if part is not None:
            for chunk in part.chunks:
                self.inflight_messages -= len(chunk.offsets)
                self.inflight_bytes -= chunk.size

    def epoch(self, tp: TopicPartition) -> int | None:
        part = self._parts.get(tp)
        return part.epoch if part else None

    def partitions(self) -> list[TopicPartition]:
        return list(self._parts)

    def pending(self) -> dict[TopicPartition, int]:
        """Records consumed and not yet settled, per partition."""
        return {tp: part.pending for tp, part in self._parts.items()}

    def consumed_to(self, tp: TopicPartition) -> int | None:
        """One past the last offset consumed of ``tp`` (None: nothing consumed yet)."""
        part = self._parts.get(tp)
        return None if part is None else part.next_offset

    # -- records ----------------------------------------------------------------------------
    def register_batch(
        self, tp: TopicPartition, offsets: list[int], size: int, timestamp: int | None
    ) -> int:
        """Records of one partition were consumed (offsets ascending, ``size`` bytes in all).

        They form one chunk: pending until settled. Returns the partition's epoch.
        """
        part = self._parts.get(tp)
        if part is None:  # records of a partition we never saw assigned: track them anyway
            self.assign(tp)
            part = self._parts[tp]
        part.chunks.append(_Chunk(offsets, size, timestamp, len(offsets)))
        part.pending += len(offsets)
        part.next_offset = offsets[-1] + 1
        self.inflight_messages += len(offsets)
        self.inflight_bytes += size
        return part.epoch

    def settle(self, tp: TopicPartition, offset: int, epoch: int) -> bool:
        """A record is settled (delivered, dropped, dead-lettered, sent to a retry topic,
        skipped). False if it belongs to a stale assignment."""
        part = self._parts.get(tp)
        if part is None or part.epoch != epoch:
            return False
        chunk = part.chunk_of(offset)
        if chunk is not None and chunk.settle(offset):
            part.pending -= 1
        return True

    def settle_many(self, tp: TopicPartition, offsets: Sequence[int], epoch: int) -> bool:
        """Records of one partition are settled (see :meth:`settle`)."""
        part = self._parts.get(tp)
        if part is None or part.epoch != epoch:
            return False
        chunk = part.chunk_of(offsets[0]) if offsets else None
        if chunk is not None and chunk.settle_run(offsets):
            part.pending -= len(offsets)
            return True
        for offset in offsets:
            self.settle(tp, offset, epoch)
        return True

    def fail(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        """The stop policy gave up on this record: never commit at or past it."""
        part = self._parts.get(tp)
        if part is not None and part.epoch == epoch:
            part.failed = offset if part.failed is None else min(part.failed, offset)
            chunk = part.chunk_of(offset)
            if chunk is not None and chunk.settle(offset):
                part.pending -= 1  # settled (as failed), so drains do not wait for it

    # -- commits ----------------------------------------------------------------------------
    def position(self, tp: TopicPartition) -> int | None:
        """The offset that may be committed now (all below it settled), or None if nothing new."""
        part = self._parts.get(tp)
        if part is None or part.next_offset is None:
            return None
        pos = part.next_offset
        if part.pending:
            for chunk in part.chunks:
                low = chunk.lowest_pending()
                if low is not None:
                    pos = low
                    break
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
        chunks = part.chunks
        while chunks and chunks[0].offsets[-1] < offset:
            chunk = chunks.popleft()
            self.inflight_messages -= len(chunk.offsets)
            self.inflight_bytes -= chunk.size
        if chunks and chunks[0].offsets[0] < offset:
            # A commit inside a chunk (a record of it settled late): release the part below.
            chunk = chunks[0]
            below = bisect_left(chunk.offsets, offset)
            size = chunk.size * below // len(chunk.offsets)
            chunk.offsets = chunk.offsets[below:]
            chunk.head = max(0, chunk.head - below)
            chunk.size -= size
            self.inflight_messages -= below
            self.inflight_bytes -= size

    def oldest_uncommitted(self, tp: TopicPartition) -> int | None:
        """The offset of the oldest record consumed and not yet committed, if any."""
        part = self._parts.get(tp)
        return part.chunks[0].offsets[0] if part is not None and part.chunks else None

    def last_committed(self, tp: TopicPartition) -> int | None:
        part = self._parts.get(tp)
        return part.committed if part else None

    def settled_uncommitted(self) -> int:
        """Records settled but not yet covered by an acknowledged commit (drives early commits)."""
        return self.inflight_messages - sum(p.pending for p in self._parts.values())

    def pending_in(self, partitions: set[TopicPartition] | None = None) -> int:
        """Records still pending, in these partitions (all when None)."""
        return sum(
            p.pending for tp, p in self._parts.items() if partitions is None or tp in partitions
        )

    def oldest_uncommitted_timestamp(self, tp: TopicPartition) -> int | None:
        """Timestamp (ms) of the oldest consumed record not yet committed, for lag in seconds.

        After a commit inside a chunk this is the chunk's first record's: a bound, older by
        at most one poll's span.
        """
        part = self._parts.get(tp)
        if part is None or not part.chunks:
            return None
        return part.chunks[0].timestamp
