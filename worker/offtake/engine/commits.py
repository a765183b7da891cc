"""Batched offset commits: by time and by count, never per message.

Asynchronous commits while running (their results arrive through librdkafka's on_commit
callback, served inside consume()); synchronous commits on revoke and on shutdown, where the
worker must know the commit landed before it lets go of a partition
(:meth:`Committer.commit_before_release`, which retries a refusal that a rebalance under way
explains).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from offtake.engine.offsets import OffsetTracker
from offtake.kafka.source import CommitRefused, KafkaSource
from offtake.metrics import Metrics
from offtake.records import TopicPartition

log = logging.getLogger("offtake.commits")

EARLY_COMMIT_FRACTION = 0.25  # commit early once a quarter of the in-flight bound is settled
MIN_COMMIT_SPACING = 0.01  # ...but never more often than this, however small the bound
# A commit before letting go that a rebalance refused is sent again after these pauses: the
# rebalance that refused it typically ends within one heartbeat interval or so.
RETRY_FIRST_PAUSE = 0.05
RETRY_MAX_PAUSE = 0.5


class CommitSchedule:
    """When a running worker commits: every ``interval`` seconds, or earlier once a quarter of
    the in-flight bound is settled (never more often than ``MIN_COMMIT_SPACING``).

    Shared by both offset-committing modes: :class:`Committer` (at-least-once) and the
    transaction's :class:`~offtake.engine.delivery.transactional.TransactionCommitter`.
    """

    def __init__(self, tracker: OffsetTracker, interval: float, max_in_flight: int) -> None:
        self.tracker = tracker
        self.interval = interval
        self.early_at = max(1, int(max_in_flight * EARLY_COMMIT_FRACTION))
        self._last = time.monotonic()

    def due(self, now: float) -> bool:
        if now - self._last >= self.interval:
            return True
        return (
            now - self._last >= MIN_COMMIT_SPACING
            and self.tracker.settled_uncommitted() >= self.early_at
        )

    def started(self, now: float) -> None:
        """A commit went out at ``now``: the interval starts again."""
        self._last = now


class CommitBook:
    """What became of the commits sent: the commit counters and latency, and the tracker
    told of each acknowledged position (which releases the records below it)."""

    def __init__(self, tracker: OffsetTracker, metrics: Metrics) -> None:
        self.tracker = tracker
        self.metrics = metrics
        self._issued: dict[TopicPartition, float] = {}  # since when a partition's commit is out

    def issued(self, partitions: Iterable[TopicPartition]) -> None:
        now = time.monotonic()
        for tp in partitions:
            self._issued.setdefault(tp, now)

    def refused(self) -> None:
        self.metrics.commits.labels("failure").inc()

    def on_commit(self, offsets: dict[TopicPartition, int] | None, error: str | None) -> None:
        """A commit's result, as the source's commit callback reports it."""
        if error is not None or offsets is None:
            self.refused()
            log.warning("commit failed: %s", error)
            return
        self.acknowledged(offsets)

    def acknowledged(self, offsets: dict[TopicPartition, int]) -> None:
        self.metrics.commits.labels("success").inc()
        now = time.monotonic()
        for tp, offset in offsets.items():
            self.tracker.committed(tp, offset)
            started = self._issued.pop(tp, None)
            if started is not None:
                self.metrics.commit_seconds.observe(now - started)


class Committer:
    """Commits the consumer's offsets (at-least-once).

    Exactly-once commits them inside the sink's transaction instead
    (:class:`offtake.engine.delivery.transactional.TransactionCommitter`), on the same
    :class:`CommitSchedule` and :class:`CommitBook`.
    """

    def __init__(
        self,
        source: KafkaSource,
        tracker: OffsetTracker,
        metrics: Metrics,
        interval: float,
        max_in_flight: int,
    ) -> None:
        self.source = source
        self.tracker = tracker
        self.schedule = CommitSchedule(tracker, interval, max_in_flight)
        self.book = CommitBook(tracker, metrics)

    def maybe_commit(self) -> None:
        now = time.monotonic()
        if self.schedule.due(now):
            self.schedule.started(now)
            self.commit(asynchronous=True)

    def commit(self, asynchronous: bool, only: set[TopicPartition] | None = None) -> bool:
        """Commit every partition whose position moved; True when nothing failed."""
        refused = self._send(asynchronous, only)
        if refused is not None:
            log.warning("commit failed: %s", refused)
        return refused is None

    def commit_before_release(self, only: set[TopicPartition] | None, deadline: float) -> bool:
        """Commit what is settled in ``only`` (all when None) synchronously, until the broker
        acknowledged it; True then (or if nothing was left to commit).

        What the worker does before it lets partitions go (revoke, shutdown). A rebalance under
        way refuses a commit for a moment (see ``CommitRefused.retriable``); letting go then
        would hand the next owner an older offset, and it would deliver again everything since
        (issue 24, item 7). So such a refusal is retried until ``deadline``; any other
        refusal, or the deadline, returns False with the partitions still uncommitted.
        """
        pause = RETRY_FIRST_PAUSE
        retried = 0
        while True:
            refused = self._send(False, only)
            if refused is None:
                if retried:
                    log.info("commit landed after %d refusal(s) during a rebalance", retried)
                return True
            left = deadline - time.monotonic()
            if not refused.retriable or left <= 0:
                log.warning(
                    "could not commit %s before letting go (%s); the next owner delivers "
                    "their records since the last commit again",
                    self._which(only),
                    refused,
                )
                return False
            if not retried:
                log.info("commit refused (%s): a rebalance is under way; retrying", refused)
            retried += 1
            time.sleep(min(pause, left))
            pause = min(2 * pause, RETRY_MAX_PAUSE)

    def _send(self, asynchronous: bool, only: set[TopicPartition] | None) -> CommitRefused | None:
        """Commit the positions that moved (in ``only``); the refusal, if any."""
        positions = {
            tp: pos
            for tp, pos in self.tracker.commit_positions().items()
            if only is None or tp in only
        }
        if not positions:
            return None
        self.book.issued(positions)
        try:
            self.source.commit(positions, asynchronous=asynchronous)
        except CommitRefused as exc:
            self.book.refused()
            return exc
        if asynchronous:
            return None
        # A synchronous commit's result has reached on_commit: any partition still above its
        # acknowledged position was not committed (a partition-level error already raised).
        left = set(positions) & set(self.tracker.commit_positions())
        return CommitRefused(f"{len(left)} partition(s) not acknowledged", False) if left else None

    def _which(self, only: set[TopicPartition] | None) -> str:
        left = [tp for tp in self.tracker.commit_positions() if only is None or tp in only]
        return f"{len(left)} partition(s) ({', '.join(map(str, sorted(left, key=str)))})"

    def on_commit(self, offsets: dict[TopicPartition, int] | None, error: str | None) -> None:
        """A commit's result: librdkafka's callback, or a synchronous commit's return."""
        self.book.on_commit(offsets, error)
