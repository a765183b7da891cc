"""The Metrics registry: docs/metrics.md's names, bounded labels, time in state, promtool's lint."""

from __future__ import annotations

import time
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.waiting import wait_for

from offtake.metrics import STATES, Metrics
from offtake.records import TopicPartition
from offtake_testbed.prometheus import promtool

from .conftest import MetricsTarget

# docs/metrics.md: these exact exported names (counters end in _total).
DESIGN_SERIES = {
    "offtake_messages_consumed_total",
    "offtake_messages_processed_total",
    "offtake_consumer_lag_messages",
    "offtake_consumer_lag_seconds",
    "offtake_backpressure_seconds_total",
    "offtake_paused_partitions",
    "offtake_assigned_partitions",
    "offtake_inflight_messages",
    "offtake_commits_total",
    "offtake_rebalances_total",
    "offtake_dlq_messages_total",
}
HISTOGRAMS = {
    "offtake_processing_duration_seconds",
    "offtake_sink_duration_seconds",
    "offtake_commit_duration_seconds",
    "offtake_spark_job_duration_seconds",
}
FORBIDDEN_LABELS = {"member_id", "client_id", "instance_id", "pod", "host", "pipeline"}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def samples(metrics: Metrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    text = generate_latest(metrics.registry).decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_every_series_named_in_design_is_exported_with_that_exact_name() -> None:
    m = Metrics("p")
    m.init_topics(["orders"])
    m.set_lag(TopicPartition("orders", 0), 3, 1.0)
    names = set(samples(m))
    assert names >= DESIGN_SERIES, DESIGN_SERIES - names
    for h in HISTOGRAMS:
        assert {f"{h}_bucket", f"{h}_sum", f"{h}_count"} <= names
    assert "offtake_build_info" in names and "offtake_spark_jobs_total" in names
    assert not [n for n in names if n.endswith("_created")]


def test_labels_are_bounded_and_never_identify_a_process() -> None:
    m = Metrics("p")
    m.init_topics(["orders"])
    m.set_lag(TopicPartition("orders", 0), 3, 1.0)
    for name, rows in samples(m).items():
        for labels, _ in rows:
            assert not FORBIDDEN_LABELS & set(labels), (name, labels)


def test_zeroed_series_exist_before_the_first_event() -> None:
    m = Metrics("p")
    m.init_topics(["orders", "payments"])
    s = samples(m)
    assert {lb["topic"] for lb, _ in s["offtake_messages_consumed_total"]} == {"orders", "payments"}
    assert {lb["result"] for lb, _ in s["offtake_commits_total"]} == {"success", "failure"}
    assert {lb["kind"] for lb, _ in s["offtake_rebalances_total"]} == {"assign", "revoke", "lost"}
    clocks = {
        "offtake_build_info",
        "offtake_state_seconds_total",
        "offtake_backpressure_seconds_total",
    }
    assert all(v == 0 for name, rows in s.items() if name not in clocks for _, v in rows)


def test_time_in_state_is_read_at_scrape_time_so_rate_is_a_fraction_of_time() -> None:
    clock = FakeClock()
    m = Metrics("p", clock=clock)
    m.set_state("busy")
    clock.now = 10.0
    m.set_state("backpressure")
    clock.now = 40.0  # 30 s into backpressure, no switch yet: the scrape must already see it
    s = samples(m)
    by_state = {lb["state"]: v for lb, v in s["offtake_state_seconds_total"]}
    assert by_state == {"busy": 10.0, "idle": 0.0, "backpressure": 30.0}
    assert s["offtake_backpressure_seconds_total"] == [({}, 30.0)]
    assert sum(by_state.values()) == clock.now
    m.set_state("idle")
    clock.now = 45.0
    assert m.states.totals() == {"busy": 10.0, "idle": 5.0, "backpressure": 30.0}
    assert set(STATES) == set(by_state)


def test_an_unknown_state_is_refused() -> None:
    m = Metrics("p")
    try:
        m.set_state("sleepy")
    except ValueError as exc:
        assert "sleepy" in str(exc)
    else:
        raise AssertionError("set_state accepted an unknown state")


def test_forget_partition_removes_its_lag_series_and_tolerates_unknown_ones() -> None:
    m = Metrics("p")
    kept, gone = TopicPartition("orders", 0), TopicPartition("orders", 1)
    m.set_lag(kept, 5, 2.0)
    m.set_lag(gone, 7, 3.0)
    m.forget_partition(gone)
    m.forget_partition(TopicPartition("never", 9))
    s = samples(m)
    for name in ("offtake_consumer_lag_messages", "offtake_consumer_lag_seconds"):
        assert [lb["partition"] for lb, _ in s[name]] == ["0"]


def scrape_after_work(target: MetricsTarget) -> bytes | None:
    """A scrape of ``target`` once it shows records consumed (the driver, or the worker, has
    moved the series a lint should see with values); None before."""
    with urllib.request.urlopen(f"http://{target.target}/metrics", timeout=5) as resp:
        body: bytes = resp.read()
    consumed = sum(
        s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.name == "offtake_messages_consumed_total"
    )
    return body if consumed > 0 else None


def test_promtool_check_metrics_finds_nothing_on_a_real_scrape(
    prometheus_binaries: tuple[str, str], metrics_target: MetricsTarget
) -> None:
    body = wait_for(lambda: scrape_after_work(metrics_target), what="records consumed")
    assert b"offtake_messages_consumed_total" in body
    result = promtool("check", "metrics", stdin=body)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr
    )


class _Tracker:
    """The offset tracker as LagGauges reads it: one partition, committed where told."""

    inflight_messages = 0
    inflight_bytes = 0

    def __init__(self, tp: TopicPartition) -> None:
        self.tp, self.committed = tp, 0

    def partitions(self) -> list[TopicPartition]:
        return [self.tp]

    def last_committed(self, tp: TopicPartition) -> int:
        return self.committed

    def oldest_uncommitted_timestamp(self, tp: TopicPartition) -> int:
        return int(time.time() * 1000)


class _Source:
    def __init__(self) -> None:
        self.end = 0

    def log_end(self, tp: TopicPartition) -> int:
        return self.end

    def oldest_timestamp(self, tp: TopicPartition, offset: int) -> None:
        return None


def test_lag_trend_is_the_change_per_second_over_the_last_minute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from offtake.engine import lag as lag_module

    clock = FakeClock()
    monkeypatch.setattr(lag_module.time, "monotonic", clock)
    tp = TopicPartition("orders", 0)
    tracker, source, m = _Tracker(tp), _Source(), Metrics("p")
    gauges = lag_module.LagGauges(source, tracker, m)  # type: ignore[arg-type]

    def trend_at(now: float, log_end: int, committed: int) -> float | None:
        clock.now, source.end, tracker.committed = now, log_end, committed
        gauges.refresh()
        rows = samples(m).get("offtake_consumer_lag_trend_messages_per_second", [])
        return rows[0][1] if rows else None

    clock.now = 1000.0
    assert trend_at(1000.0, 100, 0) is None, "one sample: no rate yet"
    assert trend_at(1010.0, 300, 0) == 20.0  # 100 -> 300 records behind in 10 s
    assert trend_at(1050.0, 300, 100) == 2.0  # 100 -> 200 in the 50 s since the first
    # 100 s after the first sample, the first two are out of the window: 200 -> 0 in 50 s.
    assert trend_at(1100.0, 300, 300) == -4.0
    gauges.forget(tp)
    m.forget_partition(tp)
    assert "offtake_consumer_lag_trend_messages_per_second" not in samples(m)
