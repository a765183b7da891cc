"""Batched offset commits: by time and by count, never per message.

Asynchronous commits while running (their results arrive through librdkafka's on_commit
callback, served inside consume()); synchronous commits on revoke and on shutdown, where the
worker must know the commit landed before it lets go of a partition.
"""

from __future__ import annotations

import logging
import time

from offtake.engine.offsets import OffsetTracker
from offtake.kafka.source import KafkaSource
from offtake.metrics import Metrics
from offtake.records import TopicPartition

log = logging.getLogger("offtake.commits")

EARLY_COMMIT_FRACTION = 0.25  # commit early once a quarter of the in-flight bound is done
MIN_COMMIT_SPACING = 0.01  # ...but never more often than this, however small the bound


class Committer:
    """Commits the consumer's offsets (at-least-once)."""

    transactional = False  # see offtake.engine.transactions for the exactly-once committer

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
        self.metrics = metrics
        self.interval = interval
        self.early_at = max(1, int(max_in_flight * EARLY_COMMIT_FRACTION))
        self._last = time.monotonic()
        self._issued: dict[TopicPartition, float] = {}

    def due(self, now: float) -> bool:
        if now - self._last >= self.interval:
            return True
        return (
            now - self._last >= MIN_COMMIT_SPACING
            and self.tracker.done_uncommitted() >= self.early_at
        )

    def maybe_commit(self) -> None:
        now = time.monotonic()
        if self.due(now):
            self._last = now
            self.commit(asynchronous=True)

    def commit(self, asynchronous: bool, only: set[TopicPartition] | None = None) -> bool:
        """Commit every partition whose position moved; True when nothing failed."""
        positions = {
            tp: pos
            for tp, pos in self.tracker.commit_positions().items()
            if only is None or tp in only
        }
        if not positions:
            return True
        now = time.monotonic()
        for tp in positions:
            self._issued.setdefault(tp, now)
        try:
            self.source.commit(positions, asynchronous=asynchronous)
        except Exception as exc:  # KafkaException: e.g. a rebalance is in progress
            self.metrics.commits.labels("failure").inc()
            log.warning("commit of %d partition(s) failed: %s", len(positions), exc)
            return False
        return True

    def on_commit(self, offsets: dict[TopicPartition, int] | None, error: str | None) -> None:
        """A commit's result: librdkafka's callback, or a synchronous commit's return."""
        if error is not None or offsets is None:
            self.metrics.commits.labels("failure").inc()
            log.warning("commit failed: %s", error)
            return
        self.metrics.commits.labels("success").inc()
        now = time.monotonic()
        for tp, offset in offsets.items():
            self.tracker.committed(tp, offset)
            started = self._issued.pop(tp, None)
            if started is not None:
                self.metrics.commit_seconds.observe(now - started)
