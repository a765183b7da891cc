"""Typed columns for schema'd sources (avro | protobuf | jsonschema): the table's column types
follow the writer's schema of each record, not what the values of one batch look like.

Each record's value carries its writer's schema id (the wire format's bytes 1-4); the schema
is fetched from the registry once per id (the client caches it) and mapped to columns by
schema_types. The sink keeps the table's columns: the union of the schemas it has written.

- A schema that adds a field (a compatible change: a new optional field with a default) adds a
  column; rows of older schemas have it null, and a field an older schema had and a newer one
  dropped stays, null in the newer rows. Nested records grow the same way.
- A schema that changes the type of a field the table has raises :class:`SchemaChangeError`
  (a :class:`SinkHalt`): nothing of the batch is written, the pipeline stops, and nothing at
  or past the batch is committed, whatever ``errors.policy`` says: the records are fine, the
  table cannot take them, and someone has to decide (a new table, or a compatible schema).
- protobuf values are decoded with the generated class (``source.protobufMessage``), so its
  descriptor gives the columns for every schema id.
- A registry that answers 401/403 for one schema id while it answers the pipeline's other
  requests refuses that id only: its records fail alone (:meth:`TypedColumns.refused`, the
  decoders' rule, formats.wire.refused_error); one that refuses every id, or does not answer,
  is an outage: RegistryUnavailable, which the sink waits out (errors.unavailable).

A value a processor reshaped (a field the schema does not have, a value of another type) does
not fit its schema's columns: that batch's columns are inferred from its values, as for json,
with a warning (docs/spark-sink.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from offtake.formats.errors import RegistryUnavailable, SchemaDecodeError
from offtake.formats.wire import refused_error
from offtake.schema_registry import is_outage, is_refusal, load_message_class
from offtake.sinks.base import SinkHalt
from offtake.sinks.spark.columns import field_name
from offtake.sinks.spark.schema_types import (
    Column,
    DoesNotFit,
    avro_columns,
    jsonschema_columns,
    protobuf_columns,
)

log = logging.getLogger(__name__)

# What a value that does not fit its column makes Arrow raise, besides our own DoesNotFit.
_MISFIT = (DoesNotFit, pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError)


class SchemaChangeError(SinkHalt):
    """A schema changes the type of a column the table already has."""


@dataclass(frozen=True)
class _TableColumn:
    type: pa.DataType
    schema_id: int | None  # the schema that gave the column this type; None: the table had it


def schema_id_of(raw: bytes | None) -> int | None:
    """The writer's schema id of a wire-format value (magic byte 0, 4-byte id), or None."""
    if raw is None or len(raw) < 5 or raw[0] != 0:
        return None
    return int.from_bytes(raw[1:5], "big")


class TypedColumns:
    """The table's columns for one pipeline's schema'd values; one per Spark sink (its job
    thread is the only caller)."""

    def __init__(self, fmt: str, client: Any, protobuf_message: Any = None) -> None:
        self.fmt = fmt
        self._client = client
        self._proto: list[Column] | None = None
        if fmt == "protobuf":
            cls = (
                load_message_class(protobuf_message)
                if isinstance(protobuf_message, str)
                else protobuf_message
            )
            self._proto = protobuf_columns(cls.DESCRIPTOR)
        self._by_id: dict[int, dict[str, Column] | None] = {}  # None: the schema has no columns
        self._table: dict[str, _TableColumn] = {}
        self._warned = False

    @property
    def table_types(self) -> dict[str, pa.DataType]:
        return {name: c.type for name, c in self._table.items()}

    def seed(self, types: dict[str, pa.DataType]) -> None:
        """Start from the columns the table already has (written before this worker started),
        so a schema change is checked against the table, not only against this worker's
        batches: a pipeline restarted after a SchemaChangeError stops again."""
        for name, t in types.items():
            self._table.setdefault(name, _TableColumn(t, None))

    def columns(
        self, values: Sequence[Any], raws: Sequence[bytes | None]
    ) -> list[tuple[str, pa.Array]] | None:
        """The value columns of a batch, typed by each value's writer schema and merged into
        the table's; None when some value does not fit (the caller infers the columns)."""
        per_value: list[dict[str, Column]] = []
        for raw in raws:
            sid = schema_id_of(raw)
            found = None if sid is None else self._schema(sid)
            if found is None:
                self._misfit(f"a value without a record schema (schema id {sid})")
                return None
            per_value.append(found)
        self._merge_all(raws)
        out: list[tuple[str, pa.Array]] = []
        try:
            for v, cols in zip(values, per_value, strict=True):
                if not isinstance(v, dict):
                    raise DoesNotFit(f"a {type(v).__name__} value, not a record")
                if not v.keys() <= cols.keys():
                    raise DoesNotFit(f"field(s) not in its schema: {sorted(set(v) - set(cols))}")
            for name, col in self._table.items():
                cells = [
                    _cell(v, cols.get(name), name)
                    for v, cols in zip(values, per_value, strict=True)
                ]
                out.append((name, pa.array(cells, col.type, from_pandas=False)))
        except _MISFIT as exc:
            self._misfit(str(exc))
            return None
        return out

    def refused(self, raws: Sequence[bytes | None]) -> dict[int, SchemaDecodeError]:
        """The values (by index) whose writer schema the registry refuses to this pipeline
        while it answers its other requests: each fails alone (dead-lettered per the policy,
        reason ``schema-id-refused``, naming the id and the registry's answer), and the rest
        of the batch is written. Raises RegistryUnavailable when the registry does not answer
        or refuses every id (an outage the sink waits out, errors.unavailable). A refused id
        is asked about again in the next batch, not remembered as the decoders do: records of
        an id the decoders were refused never reach the sink, so this is an id refused
        between the decoder's read and the sink's (its permissions changed), a rare one."""
        refusals: dict[int, SchemaDecodeError] = {}
        out: dict[int, SchemaDecodeError] = {}
        for i, raw in enumerate(raws):
            sid = schema_id_of(raw)
            if sid is None or sid in self._by_id:
                continue
            if sid not in refusals:
                try:
                    self._schema(sid)
                    continue
                except SchemaDecodeError as exc:
                    refusals[sid] = exc
            out[i] = refusals[sid]
        return out

    # -- schemas --------------------------------------------------------------------------
    def _schema(self, sid: int) -> dict[str, Column] | None:
        if sid in self._by_id:
            return self._by_id[sid]
        if self._proto is not None:
            columns: list[Column] | None = self._proto
        else:
            try:
                schema = self._client.get_schema(sid)
            except Exception as exc:
                # The decoders' rule (formats.wire.refused_error): a 401/403 for this id alone
                # is its records' error; one for the listing too, or no answer, is an outage.
                if is_refusal(exc):
                    raise refused_error(self._client, sid, exc) from None
                if is_outage(exc):
                    raise RegistryUnavailable(f"schema registry: {exc}") from exc
                raise
            try:
                mapper = avro_columns if self.fmt == "avro" else jsonschema_columns
                columns = mapper(schema.schema_str)
            except ValueError as exc:
                log.warning("schema id %d: %s; its values' columns are inferred", sid, exc)
                columns = None
        self._by_id[sid] = None if columns is None else {c.name: c for c in columns}
        return self._by_id[sid]

    def _merge_all(self, raws: Sequence[bytes | None]) -> None:
        """Fold the batch's schemas into the table's columns; all or nothing."""
        table = dict(self._table)
        for sid in dict.fromkeys(schema_id_of(r) for r in raws):
            cols = self._by_id.get(sid) if sid is not None else None
            if sid is None or cols is None:
                continue
            for name, col in cols.items():
                known = table.get(name)
                if known is None:
                    table[name] = _TableColumn(col.type, sid)
                    continue
                merged = _merge_type(known.type, col.type, name, known.schema_id, sid)
                if merged != known.type:
                    table[name] = _TableColumn(merged, known.schema_id)
        added = [n for n in table if n not in self._table]
        if added and self._table:
            log.info("the table gains column(s) %s", ", ".join(added))
        self._table = table

    def _misfit(self, why: str) -> None:
        level = logging.DEBUG if self._warned else logging.WARNING
        log.log(
            level,
            "values do not fit their writer's schema (%s): this batch's columns are inferred "
            "from its values",
            why,
        )
        self._warned = True


def _cell(value: dict[str, Any], col: Column | None, name: str) -> Any:
    x = value.get(name) if col is not None else None
    if x is None or col is None or col.convert is None:
        return x
    try:
        return col.convert(x)
    except DoesNotFit as exc:
        raise DoesNotFit(f"field {name!r}: {exc}") from None


def _merge_type(
    old: pa.DataType, new: pa.DataType, path: str, old_id: int | None, new_id: int
) -> Any:
    """``old`` grown by what ``new`` adds; SchemaChangeError naming the field if they clash."""
    if old == new:
        return old
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        fields = {old.field(i).name: old.field(i).type for i in range(old.num_fields)}
        for i in range(new.num_fields):
            f = new.field(i)
            known = fields.get(f.name)
            fields[f.name] = (
                f.type
                if known is None
                else _merge_type(known, f.type, f"{path}.{f.name}", old_id, new_id)
            )
        return pa.struct(list(fields.items()))
    if pa.types.is_list(old) and pa.types.is_list(new):
        return pa.list_(_merge_type(old.value_type, new.value_type, f"{path}[]", old_id, new_id))
    if pa.types.is_map(old) and pa.types.is_map(new):
        key = _merge_type(old.key_type, new.key_type, f"{path}{{key}}", old_id, new_id)
        item = _merge_type(old.item_type, new.item_type, f"{path}{{value}}", old_id, new_id)
        return pa.map_(key, item)
    since = "written before this worker started" if old_id is None else f"schema id {old_id}"
    raise SchemaChangeError(
        f"incompatible schema change: schema id {new_id} makes field {path!r} {new}, but the "
        f"table's column is {old} ({since}); nothing of this batch is written and "
        f"nothing from it on is committed. Write the new schema to another table "
        f"(sink.spark.path) or make the change compatible (a new optional field)"
    )


def existing_value_types(session: Any, fmt: str, path: str | None) -> dict[str, pa.DataType]:
    """The value columns a parquet or delta table already has, as Arrow types (parquet: Spark
    reads every file's footer, ``mergeSchema``; delta: its log); empty for a table not written
    yet and for the other formats."""
    if fmt not in ("parquet", "delta") or not path:
        return {}
    from pyspark.sql.pandas.types import to_arrow_type

    try:
        reader = session.read.format(fmt)
        if fmt == "parquet":
            reader = reader.option("mergeSchema", "true")
        schema = reader.load(path).schema
    except Exception as exc:  # no table yet (PATH_NOT_FOUND, UNABLE_TO_INFER_SCHEMA), or unreadable
        log.debug("no existing columns read from %s: %s", path, str(exc).splitlines()[0:1])
        return {}
    types = {}
    for f in schema.fields:
        name = field_name(f.name)
        if name is not None:
            types[name] = to_arrow_type(f.dataType, timezone="UTC")
    return types
