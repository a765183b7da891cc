"""The function pool (processing/parallel.py) on real processes: a call past
processor.timeoutSeconds is killed and fails its record alone, a process that dies fails the
record it was running, a process past processor.maxMemoryMiB is replaced between two calls;
outcomes keep the records' order throughout."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from offtake import Backpressure
from offtake.processing.parallel import FunctionPoolProcessor, PoolProcessDied, ProcessorTimeout
from offtake.records import Record


def rec(i: int, **marks: Any) -> Record:
    return Record("t", 0, i, None, {"id": i, **marks}, (), None)


@pytest.fixture
def pools() -> Iterator[list[FunctionPoolProcessor]]:
    made: list[FunctionPoolProcessor] = []
    yield made
    for pool in made:
        pool.close()


def test_a_hung_call_fails_its_record_alone_and_the_rest_go_on_in_order(
    pools: list[FunctionPoolProcessor],
) -> None:
    pool = FunctionPoolProcessor("support.processors:hang_on_marked", 2, timeout_seconds=1.0)
    pools.append(pool)
    records = [rec(i, hang=i in (3, 12)) for i in range(16)]
    out = pool.process(records)
    assert [i for i, o in enumerate(out) if not o.ok] == [3, 12]
    for i in (3, 12):
        assert isinstance(out[i].error, ProcessorTimeout)
        assert f"t[0]@{i} ran past 1s" in str(out[i].error)
    assert [o.values[0]["id"] for o in out if o.ok] == [i for i in range(16) if i not in (3, 12)]
    pids = {o.values[0]["pid"] for o in out if o.ok}
    assert os.getpid() not in pids and len(pids) >= 3  # two killed processes were replaced
    assert pool.replaced == 2
    again = pool.process([rec(i) for i in range(4)])  # the pool serves on after the kills
    assert all(o.ok for o in again)


def test_with_batch_a_hung_call_fails_its_slice(pools: list[FunctionPoolProcessor]) -> None:
    pool = FunctionPoolProcessor(
        "support.processors:hang_on_marked_batch", 2, batch=True, timeout_seconds=1.0
    )
    pools.append(pool)
    out = pool.process([rec(i, hang=i == 5) for i in range(8)])  # slices 0-3 and 4-7
    assert [o.ok for o in out] == [True] * 4 + [False] * 4
    assert isinstance(out[4].error, ProcessorTimeout)
    assert "batch of 4 records from t[0]@4" in str(out[4].error)


def test_a_process_that_dies_fails_the_record_it_ran(pools: list[FunctionPoolProcessor]) -> None:
    pool = FunctionPoolProcessor("support.processors:die_on_marked", 1, timeout_seconds=30)
    pools.append(pool)
    out = pool.process([rec(i, die=i == 2) for i in range(5)])
    assert [o.ok for o in out] == [True, True, False, True, True]
    assert isinstance(out[2].error, PoolProcessDied)
    assert "exit code 3" in str(out[2].error)


def test_a_process_past_max_memory_is_replaced_between_calls_and_nothing_fails(
    pools: list[FunctionPoolProcessor], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OFFTAKE_TEST_LEAK_KIB", "4096")  # inherited by the spawned processes
    pool = FunctionPoolProcessor("support.processors:leak", 1, max_memory_mib=96)
    pools.append(pool)
    out = pool.process([rec(i) for i in range(60)])  # 240 MiB leaked in all
    assert all(o.ok for o in out)
    assert [o.values[0]["id"] for o in out] == list(range(60))
    assert pool.replaced >= 2
    assert len({o.values[0]["pid"] for o in out}) == pool.replaced + 1


def test_backpressure_raised_in_a_pool_process_keeps_its_retry_after(
    pools: list[FunctionPoolProcessor],
) -> None:
    pool = FunctionPoolProcessor("support.processors:saturated", 1, timeout_seconds=30)
    pools.append(pool)
    (out,) = pool.process([rec(1, saturate=True)])
    assert isinstance(out.error, Backpressure) and out.error.retry_after == 1.0
