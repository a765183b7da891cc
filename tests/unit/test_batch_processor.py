"""processor.batch: true: a function of a list of records, failures kept per record."""

from __future__ import annotations

from typing import Any

import pytest

from offtake.config import ConfigError, parse_pipeline
from offtake.processing.function import BatchFunctionProcessor
from offtake.records import Record


def rec(i: int) -> Record:
    return Record("t", 0, i, None, i, (), None)


def test_results_map_to_records_in_order_and_an_exception_instance_fails_one() -> None:
    def f(records: list[Record]) -> list[Any]:
        return [
            None if r.value == 0 else ValueError("bad") if r.value == 2 else [r.value] * 2
            for r in records
        ]

    out = BatchFunctionProcessor(f).process([rec(i) for i in range(4)])
    assert [o.values for o in out] == [[], [1, 1], [], [3, 3]]
    assert [o.ok for o in out] == [True, True, False, True]
    assert str(out[2].error) == "bad"


def test_a_raising_call_is_retried_record_by_record_so_neighbours_go_on() -> None:
    calls: list[int] = []

    def f(records: list[Record]) -> list[Any]:
        calls.append(len(records))
        if any(r.value == 1 for r in records):
            raise KeyError("amount")
        return [r.value for r in records]

    out = BatchFunctionProcessor(f).process([rec(i) for i in range(3)])
    assert [o.ok for o in out] == [True, False, True]
    assert isinstance(out[1].error, KeyError) and [o.values for o in out] == [[0], [], [2]]
    assert calls == [3, 1, 1, 1]


def test_a_result_list_of_the_wrong_length_fails_every_record_with_a_clear_error() -> None:
    out = BatchFunctionProcessor(lambda records: [1]).process([rec(0), rec(1)])
    assert not any(o.ok for o in out)
    assert "one result per record: got 1 results for 2 record(s)" in str(out[0].error)


def test_batch_without_a_function_is_rejected_naming_the_field() -> None:
    doc = {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "kafka": {"bootstrapServers": "k:9092"},
            "source": {"topics": ["a"]},
            "sink": {"log": {}},
            "processor": {"batch": True},
        },
    }
    with pytest.raises(ConfigError, match=r"processor\.batch"):
        parse_pipeline(doc)
