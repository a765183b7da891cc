"""Metrics of a real worker on a real Kafka: exported lag against the broker's ground truth, and
the Prometheus checks of the driven registry (promtool lint, every dashboard query) re-run with a
real worker under load as the metrics source.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from offtake.engine.lag import LAG_REFRESH_SECONDS
from offtake_testbed.kafka import KafkaBroker

from .real_worker import RealWorker, admin_client, ground_truth_lag, produce

# The same tests as for the driven registry, collected again here where `metrics_target` is a
# real worker (pytest runs imported test functions with this module's fixtures).
from .test_metrics import (
    test_promtool_check_metrics_finds_nothing_on_a_real_scrape as test_real_worker_passes_promtool_check_metrics,  # noqa: E501
)
from .test_prometheus_scrape import (
    test_every_dashboard_query_returns_data as test_real_worker_every_dashboard_query_returns_data,
)

__all__ = [
    "test_real_worker_every_dashboard_query_returns_data",
    "test_real_worker_passes_promtool_check_metrics",
]

SPARK_PANELS = frozenset(
    {
        "Spark jobs",
        "Spark job duration",
        "Records per Spark batch",
        "Since last successful Spark batch",
    }
)


def _topic(broker: KafkaBroker, stem: str, partitions: int) -> str:
    name = f"{stem}-{uuid.uuid4().hex[:8]}"
    broker.create_topic(name, partitions)
    return name


class LoadedWorker(RealWorker):
    """A real worker under steady load: records keep arriving faster than it processes them
    (so it lags and hits backpressure), and some are poison (errors, retries, DLQ)."""

    # A Kafka sink has no Spark jobs: those panels may legitimately be empty for this source.
    optional_panels = SPARK_PANELS

    def __init__(self, broker: KafkaBroker) -> None:
        self.source = _topic(broker, "obs-load", 4)
        super().__init__(
            broker.bootstrap,
            [self.source],
            seconds_per_record=0.0005,
            sink_topic=_topic(broker, "obs-load-out", 4),
            dlq_topic=_topic(broker, "obs-load-dlq", 1),
            commit_interval=0.5,
            max_in_flight=300,
        )
        self._bootstrap = broker.bootstrap
        self._stop_load = threading.Event()
        self._load = threading.Thread(target=self._produce, name="load", daemon=True)

    def _produce(self) -> None:
        n = 0
        while not self._stop_load.wait(0.25):
            produce(self._bootstrap, self.source, range(n, n + 600), poison_every=40, partitions=4)
            n += 600

    def start(self) -> LoadedWorker:
        super().start()
        self._load.start()
        return self

    def stop(self) -> None:
        self._stop_load.set()
        self._load.join(timeout=30)
        super().stop()


@pytest.fixture(scope="module")
def metrics_target(kafka_broker: KafkaBroker) -> Iterator[LoadedWorker]:
    worker = LoadedWorker(kafka_broker).start()
    try:
        deadline = time.monotonic() + 60
        while not worker.health.readiness()[0]:
            assert time.monotonic() < deadline, "the worker never got its partitions"
            time.sleep(0.2)
        yield worker
    finally:
        worker.stop()


def test_exported_lag_equals_the_admin_api_ground_truth(kafka_broker: KafkaBroker) -> None:
    """While lagging and when caught up, /metrics' lag equals log-end minus committed (admin API)
    within one commit interval's worth of records."""
    partitions, per_partition, commit_interval = 3, 4000, 1.0
    source = _topic(kafka_broker, "obs-lag", partitions)
    produce(
        kafka_broker.bootstrap, source, range(partitions * per_partition), partitions=partitions
    )
    produced_at = time.time()
    worker = RealWorker(
        kafka_broker.bootstrap,
        [source],
        seconds_per_record=0.001,  # about 1000 records/s in all: ~12 s of lag to work off
        sink_topic=_topic(kafka_broker, "obs-lag-out", partitions),
        commit_interval=commit_interval,
    ).start()
    admin = admin_client(kafka_broker.bootstrap)
    rows: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 60
        while len(worker.exported_lag(source)[0]) < partitions:  # the group exists from here
            assert time.monotonic() < deadline, "the worker never exported lag for its partitions"
            time.sleep(0.2)
        while True:  # sample while lagging
            exported, seconds = worker.exported_lag(source)
            truth = ground_truth_lag(
                admin, kafka_broker.bootstrap, worker.group, source, partitions
            )
            stamp = time.monotonic()
            if len(exported) == partitions:
                rows.append({"t": stamp, "exported": exported, "truth": truth, "seconds": seconds})
            if sum(truth.values()) < partitions * per_partition * 0.2 or len(rows) > 40:
                break
            time.sleep(0.5)
        deadline = time.monotonic() + 120  # then wait until the broker says caught up
        while any(
            ground_truth_lag(
                admin, kafka_broker.bootstrap, worker.group, source, partitions
            ).values()
        ):
            assert time.monotonic() < deadline, "the worker did not catch up"
            time.sleep(0.5)
        deadline = time.monotonic() + 5 * LAG_REFRESH_SECONDS + commit_interval
        while True:
            caught_msgs, caught_secs = worker.exported_lag(source)
            if (set(caught_msgs.values()) == {0} and set(caught_secs.values()) == {0}) or (
                time.monotonic() > deadline
            ):
                break
            time.sleep(0.2)
    finally:
        worker.stop()

    lagging = [r for r in rows if sum(r["truth"].values()) > 0]
    assert len(lagging) >= 5, f"too few samples while lagging: {rows}"
    # One commit interval's worth of records: the most one commit moved a partition's committed
    # offset, as the broker saw it. (The engine works through partitions unevenly, so an average
    # rate over all partitions would understate it.)
    tolerance = max(
        prev["truth"][p] - cur["truth"][p]
        for prev, cur in itertools.pairwise(lagging)
        for p in range(partitions)
    )
    assert tolerance > 0, "the committed offsets never moved while sampling"
    worst, exact = 0.0, 0
    print(
        f"\nlag samples (tolerance: one commit's worth = {tolerance} records; commit interval "
        f"{commit_interval}s):"
    )
    for r in lagging:
        diffs = {p: r["exported"][p] - r["truth"][p] for p in range(partitions)}
        worst = max(worst, *(abs(d) for d in diffs.values()))
        exact += all(d == 0 for d in diffs.values())
        print(
            f"  exported {r['exported']} truth {r['truth']} diff {diffs} lag_seconds {r['seconds']}"
        )
    print(
        f"{exact}/{len(lagging)} samples exact, worst difference {worst:.0f} records; "
        f"caught up: exported {caught_msgs}, "
        f"seconds {caught_secs}"
    )
    # The gauge is refreshed every LAG_REFRESH_SECONDS and read a moment before the admin
    # query, which a loaded machine slows: the two can be one sample step apart besides the
    # commit's own step, so two steps' worth is what "equal" can mean here.
    assert worst <= 2 * tolerance, f"exported lag off by {worst} records (> 2 x {tolerance:.0f})"
    for r in lagging:  # lag in seconds: the age of records produced before the worker started
        age = time.time() - produced_at
        assert all(0 < s <= age + 1 for p, s in r["seconds"].items() if r["exported"][p] > 0), r
    assert set(caught_msgs.values()) == {0}, caught_msgs
    assert set(caught_secs.values()) == {0}, caught_secs
