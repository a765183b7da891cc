"""Rows: Kafka metadata beside the decoded value, JSON fields as columns (Arrow only)."""

from __future__ import annotations

import pyarrow as pa

from offtake.config.spec import SparkBatchSpec
from offtake.sinks.spark.batching import Batcher
from offtake.sinks.spark.columns import META_COLUMNS
from offtake.sinks.spark.rows import batch_table

from .support import item


def _batch(values: list[object]):  # type: ignore[no-untyped-def]
    b = Batcher(SparkBatchSpec(max_records=100_000, max_interval_seconds=60.0, max_bytes=1 << 27))
    for o, v in enumerate(values):
        b.add(item(o, v))
    (batch,) = b.close(None)
    return batch


def test_json_fields_become_columns_beside_the_metadata() -> None:
    t = batch_table(
        _batch([{"id": 1, "tags": ["a"], "addr": {"city": "x"}}, {"id": 2, "extra": True}]), "json"
    )
    assert t.column_names == [*META_COLUMNS, "id", "tags", "addr", "extra"]
    assert t.schema.field("timestamp").type == pa.timestamp("ms", tz="UTC")
    assert t.schema.field("key").type == pa.binary()
    assert pa.types.is_struct(t.schema.field("addr").type)
    assert t.column("extra").to_pylist() == [None, True]
    assert t.column("offset").to_pylist() == [0, 1]


def test_conflicting_types_and_all_null_fields_become_json_text() -> None:
    t = batch_table(_batch([{"v": 1, "n": None}, {"v": "one", "n": None}]), "json")
    assert t.column("v").to_pylist() == ["1", '"one"']
    assert t.schema.field("n").type == pa.string()


def test_metadata_names_in_the_value_are_kept_under_a_prefix() -> None:
    t = batch_table(_batch([{"offset": "mine", "topic": "t"}]), "json")
    assert t.column("value_offset").to_pylist() == ["mine"]
    assert t.column("offset").to_pylist() == [0]


def test_non_dict_json_values_and_string_and_bytes_formats() -> None:
    t = batch_table(_batch([[1, 2], 3]), "json")
    assert t.column("value").to_pylist() == ["[1,2]", "3"]
    t = batch_table(_batch(["héllo", {"a": 1}]), "string")
    assert t.column("value").to_pylist() == ["héllo", '{"a":1}']
    t = batch_table(_batch([b"\x00\x01", "x"]), "bytes")
    assert t.column("value").to_pylist() == [b"\x00\x01", b"x"]
