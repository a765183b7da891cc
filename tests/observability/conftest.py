"""Fixtures for the observability tests: Prometheus binaries, a metrics source, a real Prometheus.

The metrics source is the fixture ``metrics_target``: anything with a ``target`` ("host:port"
serving /metrics) and ``stop()``. Today it is ``DrivenWorker``, a real ``MetricsServer`` whose
``Metrics`` a thread drives with realistic values; a real worker under load can replace it by
overriding the fixture, and every test on top of it (promtool check metrics, the Prometheus
scrape, the dashboard evaluation) runs unchanged.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

from offtake.health import Health, MetricsServer
from offtake.metrics import Metrics
from offtake.records import TopicPartition
from offtake_testbed.prometheus import Prometheus, PrometheusTestbedError, install_prometheus

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "dashboards" / "alerts.yaml"
# The target labels Prometheus adds, as a ServiceMonitor/PodMonitor would from the pod.
STATIC_LABELS = {"namespace": "obs-test", "pipeline": "orders-enrich"}
SCRAPE_JOB = "offtake"


class MetricsTarget(Protocol):
    """Something serving an Offtake worker's /metrics on ``target`` ("host:port")."""

    @property
    def target(self) -> str: ...

    def stop(self) -> None: ...


class DrivenWorker:
    """A Metrics registry served by a real MetricsServer and driven like a busy worker.

    A thread plays a worker consuming two topics (five partitions, one of which comes and goes
    with rebalances), with a state cycle busy -> backpressure -> idle, occasional errors, DLQ
    routing, commit failures and Spark jobs, so that every series moves.
    """

    TOPICS = ("orders", "payments")
    PARTITIONS = (
        TopicPartition("orders", 0),
        TopicPartition("orders", 1),
        TopicPartition("orders", 2),
        TopicPartition("payments", 0),
    )
    CHURNING = TopicPartition("payments", 1)  # assigned and revoked by the rebalances

    def __init__(self, tick: float = 0.05, seed: int = 7) -> None:
        self.metrics = Metrics("orders-enrich")
        self.metrics.init_topics(self.TOPICS)
        self.health = Health(max_poll_interval_s=30.0)
        self.server = MetricsServer(self.metrics, self.health, port=0, host="127.0.0.1")
        self.tick = tick
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="driven-worker", daemon=True)
        self._lag = dict.fromkeys((*self.PARTITIONS, self.CHURNING), 0)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def start(self) -> DrivenWorker:
        self.server.start()
        self.health.set_ready(True)
        for _ in range(20):  # a populated registry from the first scrape on
            self.step(0)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.server.stop()

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(self.tick):
            n += 1
            self.step(n)

    def step(self, n: int) -> None:
        m, rng = self.metrics, self._rng
        self.health.heartbeat()
        phase = (n * self.tick) % 2.0  # 2 s cycle: 1.1 s busy, 0.6 s backpressure, 0.3 s idle
        state = "busy" if phase < 1.1 else ("backpressure" if phase < 1.7 else "idle")
        m.set_state(state)
        churning_assigned = (n // 60) % 2 == 0
        assigned = [*self.PARTITIONS, *([self.CHURNING] if churning_assigned else [])]
        m.assigned_partitions.set(len(assigned))
        m.paused_partitions.set(len(assigned) if state == "backpressure" else 0)
        for topic in self.TOPICS:
            if state == "backpressure":
                continue
            got = rng.randint(20, 120)
            m.consumed.labels(topic).inc(got)
            dlq, dropped = int(rng.random() < 0.3), rng.randint(0, 3)
            m.processed.labels(topic, "delivered").inc(got - dlq - dropped)
            m.processed.labels(topic, "dropped").inc(dropped)
            if dlq:
                m.processed.labels(topic, "dlq").inc()
                m.dlq_messages.labels(topic).inc()
            if rng.random() < 0.05:
                m.processed.labels(topic, "skipped").inc()
        for stage in ("decode", "process", "sink"):
            if rng.random() < 0.2:
                m.errors.labels(stage).inc()
                m.retries.inc()
        m.inflight_messages.set(rng.randint(100, 10_000))
        m.inflight_bytes.set(rng.randint(10_000, 60_000_000))
        for tp in assigned:
            self._lag[tp] = max(0, self._lag[tp] + rng.randint(-40, 60))
            m.set_lag(tp, self._lag[tp], self._lag[tp] / 200 if self._lag[tp] else 0.0)
        if not churning_assigned:
            m.forget_partition(self.CHURNING)
        m.processing_seconds.observe(rng.uniform(0.0005, 0.05))
        m.sink_seconds.observe(rng.lognormvariate(-4, 1))
        if n % 4 == 0:
            ok = rng.random() > 0.05
            m.commits.labels("success" if ok else "failure").inc()
            m.commit_seconds.observe(rng.uniform(0.001, 0.02))
        if n % 60 == 0:  # a rebalance round every 3 s: assign and revoke
            m.rebalances.labels("assign").inc()
            m.rebalances.labels("revoke").inc()
            if rng.random() < 0.2:
                m.rebalances.labels("lost").inc()
        if n % 20 == 0:
            ok = rng.random() > 0.1
            m.spark_jobs.labels("success" if ok else "failure").inc()
            m.spark_job_seconds.observe(rng.uniform(0.5, 20))
            m.spark_batch_records.observe(rng.randint(100, 100_000))
            if ok:
                m.spark_last_success.set(time.time())


@pytest.fixture(scope="session")
def prometheus_binaries() -> tuple[str, str]:
    """(prometheus, promtool), installed from Debian's package if missing; fails loudly."""
    try:
        return install_prometheus()
    except PrometheusTestbedError as exc:
        pytest.fail(f"the Prometheus testbed could not install Prometheus: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def metrics_target() -> Iterator[MetricsTarget]:
    """The worker whose /metrics the tests scrape; override to use a real worker under load."""
    worker = DrivenWorker().start()
    try:
        yield worker
    finally:
        worker.stop()


#: The objectives of the test pipeline: its operator-rendered PrometheusRule is loaded too, so
#: the dashboard's SLO row has the series it records.
TEST_SLO = {"maxLagSeconds": 60, "maxErrorRatio": 0.01, "maxTimeSinceLastCommitSeconds": 300}


def rendered_slo_groups() -> dict[str, Any]:
    """spec.groups of the PrometheusRule the operator renders for the test pipeline."""
    from offtake_operator.operator_spec import parse_operator_spec
    from offtake_operator.render.slo_rules import render_prometheus_rule

    body = {
        "metadata": {
            "name": STATIC_LABELS["pipeline"],
            "namespace": STATIC_LABELS["namespace"],
            "uid": "test",
        },
        "spec": {"slo": TEST_SLO},
    }
    slo = parse_operator_spec(body["spec"]).slo
    assert slo is not None
    return dict(render_prometheus_rule(body, slo)["spec"])


@pytest.fixture(scope="module")
def prometheus(
    prometheus_binaries: tuple[str, str],
    metrics_target: MetricsTarget,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Prometheus]:
    """A real Prometheus scraping ``metrics_target`` every second, with the alert rules and the
    test pipeline's rendered SLO rules loaded."""
    slo_rules = tmp_path_factory.mktemp("slo") / "slo-rules.yaml"
    slo_rules.write_text(yaml.safe_dump(rendered_slo_groups(), sort_keys=False))
    prom = Prometheus(
        scrape_configs=[
            {
                "job_name": SCRAPE_JOB,
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "static_configs": [{"targets": [metrics_target.target], "labels": STATIC_LABELS}],
            }
        ],
        rule_files=[ALERTS, slo_rules],
    )
    try:
        prom.start()
    except PrometheusTestbedError as exc:
        pytest.fail(f"the Prometheus testbed could not start Prometheus: {exc}", pytrace=False)
    try:
        prom.wait_for(f'up{{job="{SCRAPE_JOB}"}} == 1', timeout=30)
        yield prom
    finally:
        prom.stop()
