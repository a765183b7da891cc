"""The pass-through bench's bookkeeping: its output check and its steady-state rate.

No broker and no timings: these are the functions that decide whether a contender's run counts.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest


def _load_bench() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "passthrough.py"
    spec = importlib.util.spec_from_file_location("bench_passthrough", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


bench = _load_bench()


def test_every_key_once_is_complete() -> None:
    check = bench.verify_output(3, [b"2", b"0", b"1"])
    assert (check.records, check.unique, check.duplicates, check.missing) == (3, 3, 0, 0)
    assert check.complete


def test_duplicates_are_counted_and_allowed() -> None:
    check = bench.verify_output(3, [b"0", b"1", b"1", b"2", b"0", b"1"])
    assert (check.records, check.unique, check.duplicates, check.missing) == (6, 3, 3, 0)
    assert check.complete  # at least once


def test_a_missing_record_fails_the_run() -> None:
    check = bench.verify_output(3, [b"0", b"2", b"2"])
    assert (check.unique, check.duplicates, check.missing) == (2, 1, 1)
    assert not check.complete


def test_foreign_keys_fail_the_run() -> None:
    check = bench.verify_output(2, [b"0", b"1", b"w7", None])
    assert check.unexpected == 2
    assert not check.complete


def test_steady_rate_counts_from_first_to_last_output_record() -> None:
    # 1,000 records appended between t=5.000 s and t=5.500 s: start-up before t=5 is not charged.
    assert bench.steady_rate(1000, [5000, 5250, 5500]) == pytest.approx(2000)
    assert bench.steady_rate(1, [5000]) is None
    assert bench.steady_rate(10, [5000, 5000]) is None


def test_nearest_rank_percentile() -> None:
    values = [float(v) for v in range(1, 101)]
    assert bench.percentile(values, 99) == 99.0
    assert bench.percentile(values, 50) == 50.0
    assert bench.percentile([7.0], 99) == 7.0


def test_cpu_between_uses_the_samples_just_outside_the_window() -> None:
    samples = [(1000.0, 0.5), (1050.0, 0.6), (1100.0, 0.7), (1150.0, 0.9), (1200.0, 1.0)]
    # Output from 1060 to 1140 ms: from the sample at 1050 (0.6 s) to the one at 1150 (0.9 s).
    assert bench.cpu_between(samples, 1060, 1140) == pytest.approx(0.3)
    assert bench.cpu_between(samples, 900, 1140) is None  # started before the first sample
    assert bench.cpu_between(samples, 1060, 1300) is None  # still running at the last one


def test_cpu_by_thread_name_sums_broker_threads() -> None:
    threads = {
        "1": ("python", 2.0),
        "2": ("rdk:broker1", 0.25),
        "3": ("rdk:broker2", 0.5),
        "4": ("rdk:main", 0.125),
    }
    assert bench.by_name(threads) == {"python": 2.0, "rdk:broker": 0.75, "rdk:main": 0.12}
