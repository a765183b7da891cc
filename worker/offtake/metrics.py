"""The worker's Prometheus series (names fixed by docs/metrics.md, the dashboards and alerts).

Each worker owns a registry, so several workers in one process (tests, the test kit) do not
share counters. Labels are bounded: topic, and partition only for assigned partitions; never
member or client ids, which change on every restart. The ``namespace`` and ``pipeline`` labels
are not exported here: Prometheus adds them from the pod's labels when it scrapes (exporting
them too would clash and turn into ``exported_pipeline``).

prometheus_client appends ``_total`` to counter names: ``Counter("offtake_commits")`` is
exported as ``offtake_commits_total``.
"""

from __future__ import annotations

import contextlib
import platform
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from offtake.config.spec import is_topic_pattern
from offtake.records import TopicPartition

__all__ = [
    "COMMIT_RESULTS",
    "ERROR_STAGES",
    "LAG_MESSAGES_METRIC",
    "LAG_SECONDS_METRIC",
    "OUTCOMES",
    "REBALANCE_KINDS",
    "SPARK_RESULTS",
    "STATES",
    "Metrics",
]

# The lag series, by name: the operator's autoscalers and SLO rules query them too.
LAG_MESSAGES_METRIC = "offtake_consumer_lag_messages"
#: The age of the oldest uncommitted record, per partition.
LAG_SECONDS_METRIC = "offtake_consumer_lag_seconds"
#: Queue mode: each worker's estimate of the records past the share group's acquisition frontier.
SHARE_BACKLOG_METRIC = "offtake_share_backlog_messages"

# The ``*_created`` gauges the client adds for every counter and histogram would almost double
# the series count for a value nobody queries (Prometheus handles resets from the counter
# itself). The switch is process-wide, which is right for a worker process.
disable_created_metrics()  # type: ignore[no-untyped-call]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_JOB_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

# The bounded label values. Series for them are created at zero up front, so dashboards and
# alerts see a flat 0 (not "no data") before the first event, and rate()/increase() see the
# first event at all (a counter born at 1 has no earlier sample to rise from).
STATES = ("busy", "idle", "backpressure")
OUTCOMES = ("delivered", "dropped", "dlq", "retried", "skipped", "failed")
ERROR_STAGES = ("decode", "process", "sink")
COMMIT_RESULTS = ("success", "failure")
REBALANCE_KINDS = ("assign", "revoke", "lost")
SPARK_RESULTS = ("success", "failure")
SHARE_ACK_KINDS = ("accept", "release", "reject")
SHARE_LOCK_REASONS = ("released", "late")


def _version() -> str:
    try:
        return metadata.version("offtake")
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "unknown"


class _StateClock:
    """Time spent in each engine state, exported as counters read at scrape time.

    A plain Counter would only advance when the state changes, so a worker stuck in
    backpressure for ten minutes would show a flat line and then a jump. Adding the time
    elapsed in the current state at every scrape makes rate() the true fraction of time.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._totals = dict.fromkeys(STATES, 0.0)
        self._state = "idle"
        self._since = clock()

    @property
    def state(self) -> str:
        return self._state

    def switch(self, state: str) -> None:
        if state not in self._totals:
            raise ValueError(f"unknown engine state {state!r}; expected one of {STATES}")
        with self._lock:
            now = self._clock()
            self._totals[self._state] += now - self._since
            self._state, self._since = state, now

    def totals(self) -> dict[str, float]:
        with self._lock:
            totals = dict(self._totals)
            totals[self._state] += self._clock() - self._since
        return totals

    def describe(self) -> Iterable[Metric]:
        return self._families(dict.fromkeys(STATES, 0.0))

    def collect(self) -> Iterable[Metric]:
        return self._families(self.totals())

    @staticmethod
    def _families(totals: dict[str, float]) -> Iterator[Metric]:
        states = CounterMetricFamily(
            "offtake_state_seconds",
            "Time spent in each engine state; rate() is the fraction of time in that state.",
            labels=["state"],
        )
        for state, seconds in totals.items():
            states.add_metric([state], seconds)
        yield states
        # docs/metrics.md names this series on its own: it is the backpressure state's time.
        yield CounterMetricFamily(
            "offtake_backpressure_seconds",
            "Time with partitions paused because in-flight work reached its bound.",
            value=totals["backpressure"],
        )


class Metrics:
    """All series of one worker, with small methods the engine calls."""

    def __init__(
        self,
        pipeline: str = "",
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.pipeline = pipeline
        self._records(r)
        self.states = _StateClock(clock)
        r.register(self.states)
        self._in_flight(r)
        self._outcomes(r)
        self._queue_mode(r)
        self._latencies(r)
        self._spark(r)
        self.build_info = Info("offtake_build", "Offtake version and Python runtime.", registry=r)
        self.build_info.info({"version": _version(), "python": platform.python_version()})
        for result in COMMIT_RESULTS:
            self.commits.labels(result)
        for kind in REBALANCE_KINDS:
            self.rebalances.labels(kind)
        for stage in ERROR_STAGES:
            self.errors.labels(stage)
        for result in SPARK_RESULTS:
            self.spark_jobs.labels(result)
        for kind in SHARE_ACK_KINDS:
            self.share_acknowledged.labels(kind)
        for reason in SHARE_LOCK_REASONS:
            self.share_lock_expired.labels(reason)

    def _records(self, r: CollectorRegistry) -> None:
        """Records consumed and done, and the lag of each assigned partition."""
        self.consumed = Counter(
            "offtake_messages_consumed", "Records consumed from Kafka.", ["topic"], registry=r
        )
        self.processed = Counter(
            "offtake_messages_processed",
            "Records done: delivered to the sink, dropped by the processor, or handled by the "
            "error policy.",
            ["topic", "outcome"],
            registry=r,
        )
        self.lag_messages = Gauge(
            LAG_MESSAGES_METRIC,
            "Log-end offset minus committed offset of each assigned partition (0 when caught up).",
            ["topic", "partition"],
            registry=r,
        )
        self.lag_seconds = Gauge(
            LAG_SECONDS_METRIC,
            "Age of the oldest record not yet committed, from record timestamps "
            "(0 when caught up).",
            ["topic", "partition"],
            registry=r,
        )
        self.lag_trend = Gauge(
            "offtake_consumer_lag_trend_messages_per_second",
            "How fast the lag of each assigned partition grows (positive) or shrinks "
            "(negative), in records per second over the last minute of the worker's own samples.",
            ["topic", "partition"],
            registry=r,
        )

    def _in_flight(self, r: CollectorRegistry) -> None:
        """Partitions, records in flight and the processor's calls (the poll loop's view)."""
        self.paused_partitions = Gauge(
            "offtake_paused_partitions", "Assigned partitions paused for backpressure.", registry=r
        )
        self.delayed_partitions = Gauge(
            "offtake_delayed_partitions",
            "Retry-topic partitions paused until their next record is due.",
            registry=r,
        )
        self.assigned_partitions = Gauge(
            "offtake_assigned_partitions", "Partitions assigned to this worker.", registry=r
        )
        self.inflight_messages = Gauge(
            "offtake_inflight_messages", "Records consumed and not yet committed.", registry=r
        )
        # processor.concurrency (engine/scheduler.py): updated by the processing thread.
        self.calls_in_flight = Gauge(
            "offtake_processor_calls_in_flight",
            "Calls of the processor running now (processor.concurrency).",
            registry=r,
        )
        self.records_waiting = Gauge(
            "offtake_processor_records_waiting",
            "Records waiting behind a busy key (or partition, processor.order) to start.",
            registry=r,
        )
        self.oldest_call_seconds = Gauge(
            "offtake_processor_oldest_call_seconds",
            "Age of the oldest call of the processor still running (0 when none runs).",
            registry=r,
        )
        self.inflight_bytes = Gauge(
            "offtake_inflight_bytes", "Bytes of records consumed and not yet committed.", registry=r
        )

    def _outcomes(self, r: CollectorRegistry) -> None:
        """Commits, rebalances, dead letters, errors and retries."""
        self.commits = Counter(
            "offtake_commits", "Offset commits by result.", ["result"], registry=r
        )
        self.rebalances = Counter(
            "offtake_rebalances", "Rebalance events seen by this worker.", ["kind"], registry=r
        )
        self.dlq_messages = Counter(
            "offtake_dlq_messages",
            "Records routed to the dead-letter topic, by the topic they were consumed from.",
            ["topic"],
            registry=r,
        )
        self.errors = Counter(
            "offtake_errors", "Errors by stage, each attempt counted.", ["stage"], registry=r
        )
        self.retries = Counter("offtake_retries", "Records retried after an error.", registry=r)

    def _queue_mode(self, r: CollectorRegistry) -> None:
        """Queue mode (source.groupType share): what an autoscaler and an on-call engineer need."""
        self.share_acquired = Counter(
            "offtake_share_acquired",
            "Queue mode: records acquired from the share group (each delivery counted).",
            ["topic"],
            registry=r,
        )
        self.share_acknowledged = Counter(
            "offtake_share_acknowledged",
            "Queue mode: records acknowledged, by kind: accept (done), release (given back "
            "for another delivery), reject (archived by the broker).",
            ["kind"],
            registry=r,
        )
        self.share_redelivered = Counter(
            "offtake_share_redelivered",
            "Queue mode: records acquired with a delivery count above 1 (released, or their "
            "lock expired).",
            registry=r,
        )
        self.share_lock_expired = Counter(
            "offtake_share_lock_expired",
            "Queue mode: records whose acquisition lock ran out here: given back just before "
            "(reason=released) or acknowledged too late (reason=late).",
            ["reason"],
            registry=r,
        )
        self.share_acquired_offset = Gauge(
            "offtake_share_acquired_offset",
            "Queue mode: the highest offset of each partition this worker acquired (its "
            "acquisition frontier; the group's is the maximum over its workers).",
            ["topic", "partition"],
            registry=r,
        )
        self.share_backlog = Gauge(
            SHARE_BACKLOG_METRIC,
            "Queue mode, an estimate: records of each partition past the acquisition frontier "
            "as this worker knows it (log end minus its highest acquired offset + 1); the "
            "group's backlog is the minimum over its workers. Leaves out released records "
            "(delivered again, behind the frontier) and records acquired but not acknowledged.",
            ["topic", "partition"],
            registry=r,
        )

    def _latencies(self, r: CollectorRegistry) -> None:
        """How long a batch's processing, a record's sink and a commit take."""
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

    def _spark(self, r: CollectorRegistry) -> None:
        """The Spark sink's batch jobs."""
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

    def init_topics(self, topics: Iterable[str]) -> None:
        """Create the per-topic counters at zero for the pipeline's source topics.

        Called once at start-up, so a pipeline that has consumed nothing yet (or never routed
        to the DLQ) shows 0 rather than no data, and the first increment is visible to rate().
        """
        for topic in topics:
            if is_topic_pattern(topic):
                continue  # a pattern's topics get their series when their first record arrives
            self.consumed.labels(topic)
            self.dlq_messages.labels(topic)
            for outcome in OUTCOMES:
                self.processed.labels(topic, outcome)

    # -- time in state ------------------------------------------------------------------
    def set_state(self, state: str) -> None:
        """Account the time since the last switch to the previous state, then switch.

        ``state`` is one of STATES; anything else raises ValueError (labels stay bounded).
        """
        self.states.switch(state)

    # -- partitions -----------------------------------------------------------------------
    def set_lag(self, tp: TopicPartition, messages: int, seconds: float) -> None:
        self.lag_messages.labels(tp.topic, str(tp.partition)).set(messages)
        self.lag_seconds.labels(tp.topic, str(tp.partition)).set(seconds)

    def set_lag_trend(self, tp: TopicPartition, per_second: float) -> None:
        self.lag_trend.labels(tp.topic, str(tp.partition)).set(per_second)

    def forget_partition(self, tp: TopicPartition) -> None:
        """Drop the series of a partition no longer assigned, so labels stay bounded."""
        for gauge in (self.lag_messages, self.lag_seconds, self.lag_trend):
            with contextlib.suppress(KeyError):
                gauge.remove(tp.topic, str(tp.partition))
