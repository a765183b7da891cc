"""The queue-scaling bench's bookkeeping: what each run's workers get, its input size, the rate
over the middle of the output and the ratios it reports (goal: >= 0.8x linear).

No broker and no timings: these are the functions that decide what a run measures.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


def _load_bench() -> ModuleType:
    bench_dir = Path(__file__).resolve().parents[2] / "bench"
    # queue_scaling imports its neighbour passthrough as a script does.
    sys.path.insert(0, str(bench_dir))
    try:
        spec = importlib.util.spec_from_file_location(
            "bench_queue_scaling", bench_dir / "queue_scaling.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while being built
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(bench_dir))
    return module


bench = _load_bench()


def test_a_waiting_run_calls_the_service_in_a_share_group_with_small_polls() -> None:
    plan = bench.Plan("wait", max_poll_records=10)
    doc = bench.manifest(plan, "b:9092", "in", "out", "g", queue=True)
    spec = doc["spec"]
    assert spec["processor"] == {"function": "concurrency_calls:offtake_sync"}
    assert spec["source"]["groupType"] == "share"
    assert spec["kafka"]["config"] == {"max.poll.records": "10"}
    assert spec["source"]["topics"] == ["in"] and spec["sink"]["kafka"]["topic"] == "out"


def test_the_consumer_group_anchor_gets_the_same_function_and_no_share_settings() -> None:
    spec = bench.manifest(bench.Plan("wait"), "b:9092", "in", "out", "g", queue=False)["spec"]
    assert spec["processor"] == {"function": "concurrency_calls:offtake_sync"}
    assert "groupType" not in spec["source"] and "config" not in spec["kafka"]


def test_a_cpu_run_burns_with_the_workers_defaults() -> None:
    spec = bench.manifest(bench.Plan("cpu"), "b:9092", "in", "out", "g", queue=True)["spec"]
    assert spec["processor"] == {"function": "bench_workloads:offtake_burn"}
    assert spec["source"]["groupType"] == "share" and "config" not in spec["kafka"]


def test_a_waiting_run_grows_with_its_workers_and_a_cpu_run_does_not() -> None:
    assert bench.Plan("wait", records_per_worker=300).records_for(8) == 2_400
    assert bench.Plan("cpu", records=60_000).records_for(8) == 60_000


def test_the_rate_leaves_out_a_slow_start_and_a_tail() -> None:
    # 100 records 10 ms apart, but the first and last tenth spread over 5 s each (workers
    # starting one by one, the last polls): the middle 80 records are what counts.
    start = [i * 500 for i in range(10)]
    middle = [5_000 + i * 10 for i in range(80)]
    tail = [5_800 + i * 500 for i in range(1, 11)]
    rate = bench.middle_rate(start + middle + tail)
    assert rate == pytest.approx(79 / 0.79)  # 79 intervals over 0.79 s: 100 records/s


def test_no_rate_without_records_or_a_span() -> None:
    assert bench.middle_rate([]) is None
    assert bench.middle_rate([1_000] * 50) is None


def _run(name: str, workers: int, rate: float | None) -> dict[str, Any]:
    return {"contender": name, "workers": workers, "records_per_second": rate}


def test_a_waiting_run_has_no_consumer_group_anchor_and_a_cpu_run_starts_with_one() -> None:
    assert bench.contenders(bench.Plan("wait"), [1, 2]) == [
        ("offtake-queue", 1),
        ("offtake-queue", 2),
    ]
    assert bench.contenders(bench.Plan("cpu"), [1]) == [("offtake", 1), ("offtake-queue", 1)]


def test_a_waiting_run_is_also_read_against_n_calls_per_latency() -> None:
    runs = [_run("offtake-queue", 1, 18.0), _run("offtake-queue", 8, 128.0)]
    bench.linearity(runs, latency_ms=50)
    assert [r["x_ideal"] for r in runs] == [0.9, 0.8]  # against 20/s and 160/s
    assert [r["x_linear"] for r in runs] == [1.0, 0.89]
    assert [r["x_consumer_group"] for r in runs] == [None, None]


def test_linear_is_against_n_times_one_queue_worker() -> None:
    runs = [
        _run("offtake", 1, 20.0),
        _run("offtake-queue", 1, 19.0),
        _run("offtake-queue", 2, 38.0),
        _run("offtake-queue", 8, 121.6),
        _run("offtake-queue", 4, None),
    ]
    bench.linearity(runs)
    assert [r["x_consumer_group"] for r in runs] == [1.0, 0.95, 1.9, 6.08, None]
    assert [r.get("x_linear") for r in runs] == [None, 1.0, 1.0, 0.8, None]
