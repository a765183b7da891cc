"""errors.ordering: in-place retries overtaken (relaxed, the default) or holding their partition
(strict), on the real engine with the in-memory broker."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from test_testing import manifest

from offtake.records import Record
from offtake.testing import MemoryBroker, run_pipeline

FAILING = 3  # fails on its first two attempts, then succeeds


class FailsTwice:
    """A processing function failing some records twice each; thread-safe attempt counts."""

    def __init__(self, failing: frozenset[int] = frozenset({FAILING})) -> None:
        self.failing = failing
        self.attempts: Counter[int] = Counter()
        self._lock = threading.Lock()

    def __call__(self, record: Record) -> Any:
        rid = record.value["id"]
        with self._lock:
            self.attempts[rid] += 1
            n = self.attempts[rid]
        if rid in self.failing and n <= 2:
            raise ValueError(f"attempt {n} at {rid}")
        return record.value


def run(ordering: str | None, failing: frozenset[int] = frozenset({FAILING})) -> list[int]:
    """Ids in the order the sink got them: partition 0 holds 0..9, partition 1 holds 100..109."""
    broker = MemoryBroker()
    broker.create_topic("orders", 2)
    for i in range(10):
        broker.produce("orders", {"id": i}, key=str(i), partition=0)
        broker.produce("orders", {"id": 100 + i}, key=str(100 + i), partition=1)
    errors: dict[str, Any] = {"policy": "stop", "maxRetries": 3, "retryBackoffSeconds": 0.2}
    if ordering is not None:
        errors["ordering"] = ordering
    processor = FailsTwice(failing)
    result = run_pipeline(manifest(errors=errors), broker, processor=processor)
    assert result.ok, result
    assert all(processor.attempts[i] == 3 for i in failing)
    order = [o["id"] for o in result.outputs]  # the output topic has one partition
    assert sorted(order) == [*range(10), *range(100, 110)]
    return order


def test_by_default_a_retried_record_is_overtaken_by_those_behind_it() -> None:
    order = run(None)
    partition_0 = [i for i in order if i < 100]
    assert partition_0 != sorted(partition_0)  # 4..9 went on while 3 waited for its retry
    assert partition_0[-1] == FAILING


@pytest.mark.parametrize("runs", range(3))
def test_strict_ordering_keeps_each_partitions_order_and_holds_only_that_partition(
    runs: int,
) -> None:
    order = run("strict")
    partition_0 = [i for i in order if i < 100]
    assert partition_0 == list(range(10))  # 4..9 waited behind 3
    # The other partition was not held: all of it reached the sink before 3 (which waited
    # 0.6 s for its two retries).
    assert order.index(109) < order.index(FAILING)


def test_strict_ordering_with_a_second_failure_behind_the_first() -> None:
    """6 fails in the same batch as 3: its failure waits behind 3, then holds 7..9 itself."""
    order = run("strict", frozenset({3, 6}))
    assert [i for i in order if i < 100] == list(range(10))
    assert order.index(109) < order.index(3) < order.index(6)
