"""Lag gauges: how far behind each assigned partition is, in records and in seconds.

Lag in records is the log-end offset minus the committed offset. Lag in seconds is the age of
the oldest record not yet committed: its timestamp comes from the offset tracker when the
record is in memory, and from the source's oldest-record probe when it was not fetched yet.
The trend is the lag's change per second over the last ``TREND_WINDOW_SECONDS`` of these
samples, so that a person without Prometheus (``kubectl offtake status``) sees whether a
partition catches up or falls behind from one reading of /metrics.
Runs on the poll loop's thread, at most once per ``LAG_REFRESH_SECONDS``.
"""

from __future__ import annotations

import time
from collections import deque

from offtake.engine.offsets import OffsetTracker
from offtake.kafka.source import Source
from offtake.metrics import Metrics
from offtake.records import TopicPartition

LAG_REFRESH_SECONDS = 1.0
TREND_WINDOW_SECONDS = 60.0


class LagGauges:
    def __init__(self, source: Source, tracker: OffsetTracker, metrics: Metrics) -> None:
        self.source = source
        self.tracker = tracker
        self.metrics = metrics
        self._last = 0.0
        self._oldest_seen: dict[TopicPartition, int] = {}
        self._samples: dict[TopicPartition, deque[tuple[float, int]]] = {}

    def refresh_soon(self) -> None:
        """Export at the next refresh, not a period later (a commit just moved the offsets)."""
        self._last = 0.0

    def forget(self, tp: TopicPartition) -> None:
        self._oldest_seen.pop(tp, None)
        self._samples.pop(tp, None)

    def refresh(self) -> None:
        self.metrics.inflight_messages.set(self.tracker.inflight_messages)
        self.metrics.inflight_bytes.set(self.tracker.inflight_bytes)
        now = time.monotonic()
        if now - self._last < LAG_REFRESH_SECONDS:
            return
        self._last = now
        wall_ms = time.time() * 1000
        for tp in self.tracker.partitions():
            committed = self.tracker.last_committed(tp)
            log_end = self.source.log_end(tp)
            if log_end is None or committed is None:
                continue
            lag = max(0, log_end - committed)
            self._trend(tp, now, lag)
            oldest = self.tracker.oldest_uncommitted_timestamp(tp)
            if oldest is None and lag:
                # Lagging with nothing of the partition in memory (not fetched yet, or paused):
                # read the record at the committed offset; until the probe answers, the last
                # oldest record seen is the best bound (its age keeps growing).
                oldest = self.source.oldest_timestamp(tp, committed) or self._oldest_seen.get(tp)
            if oldest is not None:
                self._oldest_seen[tp] = oldest
            elif lag:
                continue  # no series yet rather than a wrong "0 seconds behind"
            seconds = max(0.0, (wall_ms - oldest) / 1000) if lag and oldest is not None else 0.0
            self.metrics.set_lag(tp, lag, seconds)

    def _trend(self, tp: TopicPartition, now: float, lag: int) -> None:
        samples = self._samples.setdefault(tp, deque())
        samples.append((now, lag))
        while now - samples[0][0] > TREND_WINDOW_SECONDS:
            samples.popleft()
        first_at, first_lag = samples[0]
        if now > first_at:  # two samples at least: a rate, not a guess
            self.metrics.set_lag_trend(tp, (lag - first_lag) / (now - first_at))
