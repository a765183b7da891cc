"""The concurrency bench's bookkeeping (bench/concurrency.py): its arguments, its rate over a
window of the service's counts, its ceiling and ratios, its order check, its goals and table.

No broker, no service and no timings: these are the functions that decide what a run reports.
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
    spec = importlib.util.spec_from_file_location("bench_concurrency", bench_dir / "concurrency.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


bench = _load_bench()


def test_quick_is_one_small_workload_with_every_default_family() -> None:
    s = bench.parse_args(["--quick"])
    assert (s.ns, s.partitions, s.keys, s.latencies_ms) == ((64,), (1,), (1000,), (20.0,))
    assert s.quick and s.seconds == 4.0 and s.records == 20_000
    assert "offtake-threads" not in s.families
    assert [c.name for c in s.contenders()] == [
        "offtake-c1",
        "offtake-key-64",
        "offtake-none-64",
        "arroyo-64",
        "pc-key-64",
        "pc-none-64",
    ]
    assert [w.name for w in s.workloads()] == ["p1-k1000-20ms"]


def test_the_full_matrix_by_default() -> None:
    s = bench.parse_args([])
    assert s.ns == (64, 256, 1024)
    assert len(s.workloads()) == 2 * 3 * 2  # partitions x keys x latencies
    # offtake-c1 once; the five other default families at each N.
    assert len(s.contenders()) == 1 + 5 * 3


def test_only_and_lists_are_parsed_and_checked() -> None:
    s = bench.parse_args(["--only", "pc-key,offtake-key", "--n", "8,1_024", "--keys", "10"])
    assert s.families == ("offtake-key", "pc-key")  # in the bench's own order
    assert s.ns == (8, 1024)
    assert [c.order for c in s.contenders()] == ["key", "key", "key", "key"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--only", "kafka-streams"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--n", "0"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--latency-ms", "twenty"])


def test_baseline_runs_the_other_checkouts_worker_beside_this_one(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):  # a *-base family needs a checkout to run
        bench.parse_args(["--only", "offtake-key-base"])
    with pytest.raises(SystemExit):  # a folder that is no Offtake checkout
        bench.parse_args(["--baseline", str(tmp_path)])
    (tmp_path / "worker" / "offtake").mkdir(parents=True)
    s = bench.parse_args(["--baseline", str(tmp_path), "--n", "256", "--cpus", "1"])
    assert "offtake-key-base" in s.families and "offtake-none-base" in s.families
    base = bench.Contender("offtake-key-base", 256)
    assert base.order == "key" and bench.PC_ANCHOR[base.family] == "pc-key"
    prepared = bench.Prepared(versions={}, unavailable={})
    argv, env = bench.command(
        base, prepared, "b:9092", "in", "out", "g", "http://127.0.0.1:1", tmp_path
    )
    assert argv[:3] == ["taskset", "-c", "1"]
    assert env["PYTHONPATH"].split(":")[0] == str(tmp_path.resolve() / "worker")
    ours = bench.Contender("offtake-key", 256)
    _, env = bench.command(ours, prepared, "b:9092", "in", "out", "g", "http://x", tmp_path)
    assert str(tmp_path.resolve() / "worker") not in env["PYTHONPATH"]
    bench.parse_args([])  # leave the module's globals as a plain run has them


def test_ceiling_is_the_smaller_of_n_per_latency_and_the_bare_client() -> None:
    assert bench.ceiling(64, 20, None) == pytest.approx(3200)
    assert bench.ceiling(64, 20, 1500.0) == pytest.approx(1500)
    assert bench.ceiling(1, 100, 400.0) == pytest.approx(10)
    assert bench.ratio(800, 1000) == 0.8
    assert bench.ratio(None, 1000) is None
    assert bench.ratio(800, None) is None


def test_best_of_keeps_each_rates_highest_round() -> None:
    before = {"20": {1: 40.0, 64: 900.0}}
    after = {"20": {1: 44.0, 64: None}}
    assert bench.best_of(before, after) == {"20": {1: 44.0, 64: 900.0}}


def test_calls_rate_skips_start_up_and_warm_up() -> None:
    # (wall ms, calls answered): no call for 5 s (start-up), the first seen at 5,500 ms, then
    # 100 calls a second; a 1 s warm-up: measured from the first sample at or after 6,500 ms.
    samples = [(0.0, 0), (5000.0, 0), (5500.0, 50), (6000.0, 100), (7000.0, 200), (9000.0, 400)]
    rate, start, end, calls = bench.calls_rate(samples, 1.0)
    assert (start, end, calls) == (7000.0, 9000.0, 200)
    assert rate == pytest.approx(100)
    assert bench.calls_rate([(0.0, 0), (1000.0, 0)], 1.0) == (0.0, 0.0, 0.0, 0)
    assert bench.calls_rate([(0.0, 0), (1000.0, 5)], 10.0) == (0.0, 0.0, 0.0, 0)


def test_out_of_order_counts_late_first_occurrences_only() -> None:
    in_order = [(b"a", 0), (b"b", 1), (b"a", 2), (b"b", 3)]
    assert bench.out_of_order(in_order) == 0
    assert bench.out_of_order([(b"a", 2), (b"a", 0), (b"b", 1)]) == 1
    # A redelivered record repeats an index already seen: not a reordering.
    assert bench.out_of_order([(b"a", 0), (b"a", 2), (b"a", 2), (b"a", 0)]) == 0


def test_values_carry_their_index_for_the_order_check() -> None:
    value = bench.record_value(1234)
    assert len(value) == bench.VALUE_BYTES
    assert int(value.split(b"|", 1)[0]) == 1234
    assert bench.record_key(1234, 1000) == b"k234"


def _run(family: str, n: int, rate: float, **extra: Any) -> dict[str, Any]:
    return {"family": family, "n": n, "records_per_second": rate, "overlaps": 0, **extra}


def test_summary_reads_each_contender_against_its_ceiling_and_its_parallel_consumer() -> None:
    w = bench.Workload(1, 1000, 20.0)
    runs = {
        w.name: {
            "offtake-key-64": _run("offtake-key", 64, 1200.0, rss_mib_max=80.0),
            "offtake-none-64": _run("offtake-none", 64, 1400.0),
            "arroyo-64": _run("arroyo", 64, 700.0),
            "pc-key-64": _run("pc-key", 64, 600.0),
            "pc-none-64": _run("pc-none", 64, 1400.0),
            "offtake-c1": _run("offtake-c1", 1, 45.0),
        }
    }
    bare = {"20": {1: 44.0, 64: 1500.0}}
    row = bench.summarize(runs, bare, [w])[w.name]
    assert row["offtake-key-64"]["ceiling"] == 1500.0
    assert row["offtake-key-64"]["x_ceiling"] == 0.8
    assert row["offtake-key-64"]["x_pc"] == 2.0  # against pc-key-64
    assert row["offtake-none-64"]["x_pc"] == 1.0  # against pc-none-64
    assert row["arroyo-64"]["x_pc"] == 0.5  # order none: against pc-none-64
    assert row["offtake-c1"]["ceiling"] == 44.0 and row["offtake-c1"]["x_pc"] is None
    goals = bench.goals({w.name: row}, [w])
    met = {(g["goal"].split(" (")[0], g["contender"]): g["met"] for g in goals}
    assert met[(">= 0.8x ceiling", "offtake-key-64")] is True
    assert met[(">= 0.8x ceiling", "offtake-none-64")] is True  # 1400 / 1500
    assert met[(">= Parallel Consumer", "offtake-key-64")] is True
    assert met[(">= Parallel Consumer", "offtake-none-64")] is True
    assert met[("0 overlapping calls of one key", "offtake-key-64")] is True
    assert not any(g["contender"] in ("offtake-c1", "arroyo-64") for g in goals)


def test_rss_goal_compares_the_most_keys_with_the_fewest() -> None:
    few, many = bench.Workload(12, 10, 20.0), bench.Workload(12, 100_000, 20.0)
    runs = {
        few.name: {"offtake-key-64": _run("offtake-key", 64, 500.0, rss_mib_max=80.0)},
        many.name: {"offtake-key-64": _run("offtake-key", 64, 1500.0, rss_mib_max=140.0)},
    }
    summary = bench.summarize(runs, {}, [few, many])
    (rss,) = [g for g in bench.goals(summary, [few, many]) if g["goal"].startswith("RSS")]
    assert (rss["value"], rss["met"]) == (60.0, False)


def test_table_names_every_contender_and_the_load() -> None:
    w = bench.Workload(1, 1000, 20.0)
    runs = {w.name: {"pc-key-64": _run("pc-key", 64, 600.0, status="ok")}}
    summary = bench.summarize(runs, {"20": {64: 1500.0}}, [w])
    report = {
        "kafka_version": "4.3.1",
        "cpus": 2,
        "load_average": {"start": [5.0, 4.0, 3.0], "end": [6.0, 5.0, 4.0]},
        "seconds_per_run": 4.0,
        "warmup_seconds": 2.0,
        "records": 20_000,
        "bare_client": {"20": {64: 1500.0}},
        "summary": summary,
        "goals": [],
        "unavailable": {"arroyo": "no venv"},
        "versions": {"parallel-consumer-core": "0.5.3.3"},
    }
    text = bench.render(report)
    assert "pc-key-64" in text and "600" in text and "0.40" in text
    assert "[5.0, 4.0, 3.0]" in text
    assert "skipped arroyo: no venv" in text
