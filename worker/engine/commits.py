"""Batched offset commits: by time and by count, never per message.

Asynchronous commits while running (their results arrive through librdkafka's on_commit
callback, served inside consume()); synchronous commits on revoke and on shutdown, where the
worker must know the commit landed before it lets go of a partition.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from offtake.engine.offsets import OffsetTracker
from offtake.kafka.protocols import ConsumerLike
from offtake.metrics import Metrics
from offtake.records import TopicPartition

log = logging.getLogger("offtake.commits")

EARLY_COMMIT_FRACTION = 0.25  # commit early once a quarter of the in-flight bound is done
MIN_COMMIT_SPACING = 0.05  # ...but never more often than this, however small the bound


class Committer:
    def __init__(
        self,
        consumer: ConsumerLike,
        tracker: OffsetTracker,
        metrics: Metrics,
        interval: float,
        max_in_flight: int,
        make_tp: Callable[[str, int, int], Any],
    ) -> None:
        self.consumer = consumer
        self.tracker = tracker
        self.metrics = metrics
        self.interval = interval
        self.early_at = max(1, int(max_in_flight * EARLY_COMMIT_FRACTION))
        self.make_tp = make_tp
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
        offsets = [self.make_tp(tp.topic, tp.partition, pos) for tp, pos in positions.items()]
        now = time.monotonic()
        for tp in positions:
            self._issued.setdefault(tp, now)
        try:
            result = self.consumer.commit(offsets=offsets, asynchronous=asynchronous)
        except Exception as exc:  # KafkaException: e.g. a rebalance is in progress
            self.metrics.commits.labels("failure").inc()
            log.warning("commit of %d partition(s) failed: %s", len(offsets), exc)
            return False
        if not asynchronous and result is not None:
            self.on_commit(None, result)
        return True

    def on_commit(self, err: Any, partitions: list[Any]) -> None:
        """librdkafka's commit callback (and the result of synchronous commits)."""
        if err is not None:
            self.metrics.commits.labels("failure").inc()
            log.warning("commit failed: %s", err)
            return
        self.metrics.commits.labels("success").inc()
        now = time.monotonic()
        for p in partitions:
            tp = TopicPartition(p.topic, p.partition)
            if getattr(p, "error", None) is not None or p.offset < 0:
                continue
            self.tracker.committed(tp, p.offset)
            started = self._issued.pop(tp, None)
            if started is not None:
                self.metrics.commit_seconds.observe(now - started)
