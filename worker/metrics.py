"""The worker's Prometheus series (names fixed by shared/DESIGN.md; see docs/metrics.md).

Each worker owns a registry, so several workers in one process (tests, the test kit) do not
share counters. Labels are bounded: topic, and partition only for assigned partitions; never
member or client ids, which change on every restart.
"""

from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from offtake.records import TopicPartition

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_JOB_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
STATES = ("busy", "idle", "backpressure")


class Metrics:
    """All series of one worker, with small methods the engine calls."""

    def __init__(self, pipeline: str = "", registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.pipeline = pipeline
        self.consumed = Counter(
            "offtake_messages_consumed", "Records consumed from Kafka.", ["topic"], registry=r
        )
        self.processed = Counter(
            "offtake_messages_processed",
            "Records done: delivered to the sink, dropped by the processor, or handled by the error policy.",
            ["topic", "outcome"],
            registry=r,
        )
        self.lag_messages = Gauge(
            "offtake_consumer_lag_messages",
            "Log-end offset minus committed offset of each assigned partition (0 when caught up).",
            ["topic", "partition"],
            registry=r,
        )
        self.lag_seconds = Gauge(
            "offtake_consumer_lag_seconds",
            "Age of the oldest record not yet committed, from record timestamps (0 when caught up).",
            ["topic", "partition"],
            registry=r,
        )
        self.state_seconds = Counter(
            "offtake_state_seconds",
            "Time spent in each engine state; rate() is the fraction of time in that state.",
            ["state"],
            registry=r,
        )
        self.backpressure_seconds = Counter(
            "offtake_backpressure_seconds",
            "Time with partitions paused because in-flight work reached its bound.",
            registry=r,
        )
        self.paused_partitions = Gauge(
            "offtake_paused_partitions", "Assigned partitions paused for backpressure.", registry=r
        )
        self.assigned_partitions = Gauge(
            "offtake_assigned_partitions", "Partitions assigned to this worker.", registry=r
        )
        self.inflight_messages = Gauge(
            "offtake_inflight_messages", "Records consumed and not yet committed.", registry=r
        )
        self.inflight_bytes = Gauge(
            "offtake_inflight_bytes", "Bytes of records consumed and not yet committed.", registry=r
        )
        self.commits = Counter(
            "offtake_commits", "Offset commits acknowledged by the broker.", ["result"], registry=r
        )
        self.rebalances = Counter(
            "offtake_rebalances", "Rebalance events seen by this worker.", ["kind"], registry=r
        )
        self.dlq_messages = Counter(
            "offtake_dlq_messages", "Records routed to the dead-letter topic.", ["topic"], registry=r
        )
        self.errors = Counter(
            "offtake_errors", "Processing and sink errors, before retries.", ["stage"], registry=r
        )
        self.retries = Counter("offtake_retries", "Records retried after an error.", registry=r)
        self.processing_seconds = Histogram(
            "offtake_processing_duration_seconds",
            "Time to process one batch of records.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.sink_seconds = Histogram(
            "offtake_sink_duration_seconds",
            "Time from submitting a record to the sink until the sink confirmed it.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.commit_seconds = Histogram(
            "offtake_commit_duration_seconds",
            "Time from issuing a commit until the broker acknowledged it.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.spark_jobs = Counter(
            "offtake_spark_jobs", "Spark batch jobs by result.", ["result"], registry=r
        )
        self.spark_job_seconds = Histogram(
            "offtake_spark_job_duration_seconds",
            "Duration of Spark batch jobs.",
            buckets=_JOB_BUCKETS,
            registry=r,
        )
        self.spark_batch_records = Histogram(
            "offtake_spark_batch_records",
            "Records per Spark batch.",
            buckets=(1, 10, 100, 1_000, 10_000, 100_000, 1_000_000),
            registry=r,
        )
        self.spark_last_success = Gauge(
            "offtake_spark_last_success_timestamp_seconds",
            "Unix time of the last successful Spark batch.",
            registry=r,
        )
        self.build_info = Info("offtake_build", "Offtake version and pipeline.", registry=r)
        self._state = "idle"
        self._state_since = time.monotonic()
        self._lock = threading.Lock()
        for state in STATES:
            self.state_seconds.labels(state).inc(0)
        for result in ("success", "failure"):
            self.commits.labels(result).inc(0)

    # -- time in state ------------------------------------------------------------------
    def set_state(self, state: str) -> None:
        """Account the time since the last call to the previous state, then switch."""
        with self._lock:
            now = time.monotonic()
            elapsed = now - self._state_since
            self.state_seconds.labels(self._state).inc(elapsed)
            if self._state == "backpressure":
                self.backpressure_seconds.inc(elapsed)
            self._state, self._state_since = state, now

    # -- partitions -----------------------------------------------------------------------
    def set_lag(self, tp: TopicPartition, messages: int, seconds: float) -> None:
        self.lag_messages.labels(tp.topic, str(tp.partition)).set(messages)
        self.lag_seconds.labels(tp.topic, str(tp.partition)).set(seconds)

    def forget_partition(self, tp: TopicPartition) -> None:
        """Drop the series of a partition no longer assigned, so labels stay bounded."""
        for gauge in (self.lag_messages, self.lag_seconds):
            try:
                gauge.remove(tp.topic, str(tp.partition))
            except KeyError:
                pass
