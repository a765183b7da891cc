"""Batch items as rows: Kafka metadata beside the decoded value.

Every row has ``topic``, ``partition``, ``offset``, ``timestamp`` and ``key`` (the columns
Spark's own Kafka source uses, so queries port between the two), then the value:

- ``json``: a dict's fields become columns (nested dicts become structs, lists arrays); a
  field named like a metadata column is kept as ``value_<name>``; a value that is not a dict
  lands in a ``value`` column as JSON text.
- ``string``: a ``value`` string column. ``bytes``: a ``value`` binary column.
- ``avro``, ``protobuf``, ``jsonschema``: the writer's schema's fields become columns of the
  types the schema gives them (schema_columns), not types guessed from one batch's values.

The table is built in Arrow, which both classic PySpark and Spark Connect take without a
per-row Python round trip. The schema is inferred per batch; a field whose values disagree in
type within a batch is written as JSON text rather than failing the batch, and a field that is
null in every row is a string column (Parquet has no null type).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from offtake.config.spec import Format
from offtake.formats.plain import encode_value
from offtake.sinks.spark.batching import Batch
from offtake.sinks.spark.columns import META_COLUMNS, column_name
from offtake.sinks.spark.schema_columns import TypedColumns

VALUE_COLUMN = "value"

_META_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("ms", tz="UTC")),
        ("key", pa.binary()),
    ]
)


def batch_table(batch: Batch, fmt: Format, typed: TypedColumns | None = None) -> pa.Table:
    """The rows of a batch as an Arrow table (one row per value; items without values add none).

    ``typed``: the columns of a schema'd source; SchemaChangeError if the batch's schemas
    clash with the table's."""
    meta: dict[str, list[Any]] = {name: [] for name in META_COLUMNS}
    values: list[Any] = []
    raws: list[bytes | None] = []
    for item in batch.items:
        r = item.record
        for value in item.values:
            meta["topic"].append(r.topic)
            meta["partition"].append(r.partition)
            meta["offset"].append(r.offset)
            meta["timestamp"].append(r.timestamp)
            meta["key"].append(r.key)
            values.append(value)
            raws.append(r.raw_value)
    columns = [pa.array(meta[f.name], f.type) for f in _META_SCHEMA]
    names = list(META_COLUMNS)
    typed_columns = typed.columns(values, raws) if typed is not None and values else None
    for name, array in typed_columns or _value_columns(values, fmt):
        names.append(column_name(name) if typed_columns else name)
        columns.append(array)
    return pa.Table.from_arrays(columns, names=names)


def _value_columns(values: Sequence[Any], fmt: Format) -> Iterable[tuple[str, pa.Array]]:
    if fmt == "bytes":
        yield VALUE_COLUMN, pa.array([encode_value(v) for v in values], pa.binary())
        return
    if fmt == "string":
        yield VALUE_COLUMN, pa.array([_as_text(v) for v in values], pa.string())
        return
    yield from _json_columns(values)


def _json_columns(values: Sequence[Any]) -> Iterable[tuple[str, pa.Array]]:
    fields: dict[str, None] = {}  # insertion-ordered set: columns in first-seen order
    others = False
    for v in values:
        if isinstance(v, dict):
            for k in v:
                fields.setdefault(str(k), None)
        elif v is not None:
            others = True
    for name in fields:
        column = [v.get(name) if isinstance(v, dict) else None for v in values]
        yield column_name(name), _infer(column, name)
    if others or not fields:
        text = [None if isinstance(v, dict) or v is None else _as_json(v) for v in values]
        name = VALUE_COLUMN if VALUE_COLUMN not in fields else f"{VALUE_COLUMN}_json"
        yield name, pa.array(text, pa.string())


def _infer(column: list[Any], name: str) -> pa.Array:
    """Arrow's own inference, falling back to JSON text when the values disagree in type."""
    try:
        array = pa.array(column, from_pandas=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.array([None if v is None else _as_json(v) for v in column], pa.string())
    if _has_null_type(array.type):
        # Spark cannot store a void column, and an empty struct has no Spark equivalent.
        return pa.array([None if v is None else _as_json(v) for v in column], pa.string())
    return array


def _has_null_type(t: pa.DataType) -> bool:
    if pa.types.is_null(t):
        return True
    if pa.types.is_struct(t):
        return t.num_fields == 0 or any(
            _has_null_type(t.field(i).type) for i in range(t.num_fields)
        )
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_null_type(t.value_type)
    return False


def _as_text(v: Any) -> str | None:
    raw = encode_value(v)
    return None if raw is None else raw.decode("utf-8", errors="replace")


def _as_json(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False, default=str)
