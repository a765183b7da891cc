"""A writer's schema (Avro, Protobuf, JSON Schema) as typed Arrow columns.

Each top-level field of the schema becomes a :class:`Column`: its name, the Arrow type that
Spark turns into the matching Spark type, and a converter for values Arrow cannot take as they
are (a protobuf Timestamp's RFC 3339 text, an Avro UUID, a JSON Schema ``date-time`` string).
docs/spark-sink.md ("Schema'd sources: typed columns") has the table of mappings.

What has no column type of its own (a union of several non-null types, a recursive type, a
protobuf ``Struct``, a JSON Schema ``oneOf``) is a string column holding the value as JSON
text: the value is kept whole, only its type is not. A value that does not fit its column's
type raises :class:`DoesNotFit` (a processor reshaped it); the caller then infers the batch's
columns from the values instead.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from offtake.errors import OfftakeError

Convert = Callable[[Any], Any]


class DoesNotFit(OfftakeError, ValueError):
    """A value does not have the shape of its schema."""


class Unmapped(OfftakeError, ValueError):
    """A schema part with no column type; the field becomes JSON text."""


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    convert: Convert | None = None  # None: Arrow takes the value as it is


@dataclass(frozen=True)
class Typed:
    """A schema part's Arrow type and converter; a struct's also its fields."""

    type: pa.DataType
    convert: Convert | None = None
    fields: tuple[Column, ...] = ()


def as_json_text(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False, default=str)


_JSON_TEXT = Typed(pa.string(), as_json_text)


def struct(fields: Iterable[tuple[str, Typed]]) -> Typed:
    """A struct of ``fields``; its converter refuses keys the schema does not name (Arrow
    would silently drop them)."""
    columns = tuple(Column(name, t.type, t.convert) for name, t in fields)
    if not columns:
        raise Unmapped("a record without fields")  # Spark has no empty struct
    arrow = pa.struct([pa.field(c.name, c.type) for c in columns])
    names = frozenset(c.name for c in columns)
    converters = [(c.name, c.convert) for c in columns if c.convert is not None]

    def convert(v: Any) -> Any:
        if not isinstance(v, Mapping):
            raise DoesNotFit(f"expected a record, got {type(v).__name__}")
        if not v.keys() <= names:
            raise DoesNotFit(f"field(s) not in the schema: {sorted(set(v) - names)}")
        if not converters:
            return v
        out = dict(v)
        for name, c in converters:
            x = out.get(name)
            if x is not None:
                out[name] = c(x)
        return out

    return Typed(arrow, convert, columns)


def array(items: Typed) -> Typed:
    conv = items.convert
    if conv is None:
        return Typed(pa.list_(items.type))
    each = conv

    def convert(v: Any) -> Any:
        if not isinstance(v, list | tuple):
            raise DoesNotFit(f"expected a list, got {type(v).__name__}")
        return [None if x is None else each(x) for x in v]

    return Typed(pa.list_(items.type), convert)


def mapping(keys: Typed, values: Typed) -> Typed:
    arrow = pa.map_(keys.type, values.type)
    kc, vc = keys.convert, values.convert
    if kc is None and vc is None:
        return Typed(arrow)

    def convert(v: Any) -> Any:
        if not isinstance(v, Mapping):
            raise DoesNotFit(f"expected a map, got {type(v).__name__}")
        return [
            (k if kc is None else kc(k), x if vc is None or x is None else vc(x))
            for k, x in v.items()
        ]

    return Typed(arrow, convert)


def _check(value: Any, *kinds: type) -> Any:
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise DoesNotFit(f"expected {'/'.join(k.__name__ for k in kinds)}, got {value!r:.40}")
    return value


# -- Avro --------------------------------------------------------------------------------------
_AVRO_PRIMITIVES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}


def avro_columns(schema_str: str) -> list[Column]:
    """Columns of an Avro record schema (the writer's); ValueError if it is not a record."""
    schema = json.loads(schema_str)
    if not (isinstance(schema, dict) and schema.get("type") == "record"):
        raise ValueError("the Avro schema is not a record: no columns to map it to")
    return list(_AvroTypes().of(schema, None).fields)


class _AvroTypes:
    def __init__(self) -> None:
        self.named: dict[str, Typed] = {}
        self.defining: set[str] = set()

    def of(self, t: Any, namespace: str | None) -> Typed:
        if isinstance(t, str):
            return self._name(t, namespace)
        if isinstance(t, list):
            return self._union(t, namespace)
        if not isinstance(t, dict):
            raise Unmapped(f"not an Avro type: {t!r:.60}")
        kind, logical = t.get("type"), t.get("logicalType")
        if logical is not None:
            found = self._logical(kind, logical, t)
            if found is not None:
                return found
        if kind == "record":
            return self._record(t, namespace)
        if kind == "enum":
            return self._define(t, namespace, Typed(pa.string()))
        if kind == "fixed":
            return self._define(t, namespace, Typed(pa.binary()))
        if kind == "array":
            return array(self._field(t.get("items"), namespace))
        if kind == "map":
            return mapping(Typed(pa.string()), self._field(t.get("values"), namespace))
        return self.of(kind, namespace)  # a primitive written as {"type": "long"}

    def _field(self, t: Any, namespace: str | None) -> Typed:
        """A part that may be unmappable: then it is JSON text, the rest keeps its types."""
        try:
            return self.of(t, namespace)
        except Unmapped:
            return _JSON_TEXT

    def _name(self, name: str, namespace: str | None) -> Typed:
        if name in _AVRO_PRIMITIVES:
            return Typed(_AVRO_PRIMITIVES[name])
        if name == "null":
            raise Unmapped("null")
        full = name if "." in name or not namespace else f"{namespace}.{name}"
        for key in (full, name):
            if key in self.defining:
                raise Unmapped(f"recursive type {name}")
            if key in self.named:
                return self.named[key]
        raise Unmapped(f"unknown type {name} (a reference to another schema)")

    def _union(self, members: list[Any], namespace: str | None) -> Typed:
        others = [m for m in members if m != "null"]
        if len(others) == 1:  # ["null", X]: a nullable X
            return self.of(others[0], namespace)
        return _JSON_TEXT

    def _full_name(self, t: dict[str, Any], namespace: str | None) -> tuple[str, str | None]:
        name = str(t.get("name", ""))
        if "." in name:
            return name, name.rpartition(".")[0]
        ns = t.get("namespace", namespace)
        return (f"{ns}.{name}" if ns else name), ns

    def _define(self, t: dict[str, Any], namespace: str | None, typed: Typed) -> Typed:
        full, _ = self._full_name(t, namespace)
        self.named[full] = self.named[str(t.get("name"))] = typed
        return typed

    def _record(self, t: dict[str, Any], namespace: str | None) -> Typed:
        full, ns = self._full_name(t, namespace)
        self.defining.add(full)
        try:
            fields = [(str(f["name"]), self._field(f["type"], ns)) for f in t.get("fields", [])]
        finally:
            self.defining.discard(full)
        return self._define(t, namespace, struct(fields))

    def _logical(self, kind: Any, logical: str, t: dict[str, Any]) -> Typed | None:
        if logical == "decimal" and kind in ("bytes", "fixed"):
            precision, scale = int(t.get("precision", 38)), int(t.get("scale", 0))
            if precision > 38:  # past Spark's DecimalType: exact text
                return Typed(pa.string(), str)
            return Typed(pa.decimal128(precision, scale))
        # Microseconds either way: Spark's timestamps are, so the table's columns read back
        # (schema_columns.existing_value_types) match the schema's.
        if kind == "long" and logical in ("timestamp-millis", "timestamp-micros"):
            return Typed(pa.timestamp("us", "UTC"))
        if kind == "long" and logical in ("local-timestamp-millis", "local-timestamp-micros"):
            return Typed(pa.timestamp("us"))
        if kind == "int" and logical == "date":
            return Typed(pa.date32())
        if logical in ("time-millis", "time-micros"):
            # Spark has no time-of-day type: ISO text (fastavro gives datetime.time).
            return Typed(pa.string(), _isoformat)
        if kind == "string" and logical == "uuid":
            return Typed(pa.string(), str)
        return None  # an unknown logical type: the underlying type, as the spec says


def _isoformat(v: Any) -> Any:
    return v.isoformat() if hasattr(v, "isoformat") else str(v)


# -- Protobuf ----------------------------------------------------------------------------------
def protobuf_columns(descriptor: Any) -> list[Column]:
    """Columns of a protobuf message (its ``DESCRIPTOR``), for values in protobuf's JSON
    mapping as the source decodes them (MessageToDict)."""
    return list(_ProtoTypes().message(descriptor).fields)


def _b64(v: Any) -> bytes:
    return base64.b64decode(_check(v, str)) if isinstance(v, str) else _check(v, bytes)


def _to_int(v: Any) -> int:
    return int(_check(v, int, str))  # 64-bit integers may be JSON strings


def _to_decimal(v: Any) -> decimal.Decimal:
    return decimal.Decimal(_to_int(v))


def _to_float(v: Any) -> float:
    return float(_check(v, int, float, str))  # "NaN", "Infinity" in the JSON mapping


def _to_bool(v: Any) -> bool:
    if isinstance(v, str):  # a map key
        return v == "true"
    return bool(_check(v, bool))


def _proto_timestamp(v: Any) -> dt.datetime:
    from google.protobuf.timestamp_pb2 import Timestamp

    ts = Timestamp()
    ts.FromJsonString(_check(v, str))
    stamp: dt.datetime = ts.ToDatetime(tzinfo=dt.UTC)
    return stamp


_WRAPPERS = {
    "google.protobuf.DoubleValue": Typed(pa.float64(), _to_float),
    "google.protobuf.FloatValue": Typed(pa.float32(), _to_float),
    "google.protobuf.Int64Value": Typed(pa.int64(), _to_int),
    "google.protobuf.UInt64Value": Typed(pa.decimal128(20, 0), _to_decimal),
    "google.protobuf.Int32Value": Typed(pa.int32(), _to_int),
    "google.protobuf.UInt32Value": Typed(pa.int64(), _to_int),
    "google.protobuf.BoolValue": Typed(pa.bool_(), _to_bool),
    "google.protobuf.StringValue": Typed(pa.string(), None),
    "google.protobuf.BytesValue": Typed(pa.binary(), _b64),
}


class _ProtoTypes:
    def __init__(self) -> None:
        self.defining: set[str] = set()

    def message(self, d: Any) -> Typed:
        name = d.full_name
        if name == "google.protobuf.Timestamp":
            return Typed(pa.timestamp("us", "UTC"), _proto_timestamp)
        if name in _WRAPPERS:
            return _WRAPPERS[name]
        if name.startswith("google.protobuf."):  # Struct, Value, Any, Duration, FieldMask...
            return _JSON_TEXT if name != "google.protobuf.Duration" else Typed(pa.string())
        if name in self.defining:
            raise Unmapped(f"recursive message {name}")
        self.defining.add(name)
        try:
            return struct((f.name, self._field(f)) for f in d.fields)
        finally:
            self.defining.discard(name)

    def _field(self, f: Any) -> Typed:
        try:
            if f.message_type is not None and f.message_type.GetOptions().map_entry:
                entry = f.message_type.fields_by_name
                return mapping(self._single(entry["key"]), self._single(entry["value"]))
            one = self._single(f)
        except Unmapped:
            return _JSON_TEXT
        return array(one) if _is_repeated(f) else one

    def _single(self, f: Any) -> Typed:
        from google.protobuf.descriptor import FieldDescriptor as F

        t = f.type
        if t == F.TYPE_MESSAGE or t == F.TYPE_GROUP:
            return self.message(f.message_type)
        if t == F.TYPE_ENUM:
            return Typed(pa.string())  # the value's name, as the JSON mapping gives it
        if t in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
            return Typed(pa.int32(), _to_int)
        if t in (F.TYPE_UINT32, F.TYPE_FIXED32):
            return Typed(pa.int64(), _to_int)  # Spark has no unsigned types
        if t in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64):
            return Typed(pa.int64(), _to_int)
        if t in (F.TYPE_UINT64, F.TYPE_FIXED64):
            return Typed(pa.decimal128(20, 0), _to_decimal)
        if t == F.TYPE_DOUBLE:
            return Typed(pa.float64(), _to_float)
        if t == F.TYPE_FLOAT:
            return Typed(pa.float32(), _to_float)
        if t == F.TYPE_BOOL:
            return Typed(pa.bool_(), _to_bool)
        if t == F.TYPE_BYTES:
            return Typed(pa.binary(), _b64)
        return Typed(pa.string())


def _is_repeated(f: Any) -> bool:
    flag = getattr(f, "is_repeated", None)  # protobuf 6+; `label` is deprecated there
    if flag is not None:
        return bool(flag)
    from google.protobuf.descriptor import FieldDescriptor as F

    return bool(f.label == F.LABEL_REPEATED)


# -- JSON Schema -------------------------------------------------------------------------------
def jsonschema_columns(schema_str: str) -> list[Column]:
    """Columns of a JSON Schema whose root is an object with ``properties``."""
    root = json.loads(schema_str)
    if not (isinstance(root, dict) and isinstance(root.get("properties"), dict)):
        raise ValueError("the JSON Schema's root is not an object with properties")
    return list(_JsonTypes(root).of(root).fields)


def _date_time(v: Any) -> dt.datetime:
    try:
        parsed = dt.datetime.fromisoformat(_check(v, str))
    except ValueError as exc:
        raise DoesNotFit(str(exc)) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def _date(v: Any) -> dt.date:
    try:
        return dt.date.fromisoformat(_check(v, str))
    except ValueError as exc:
        raise DoesNotFit(str(exc)) from None


class _JsonTypes:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.defining: set[str] = set()

    def of(self, s: Any) -> Typed:
        try:
            return self._of(s)
        except Unmapped:
            return _JSON_TEXT

    def _of(self, s: Any) -> Typed:
        if not isinstance(s, dict):
            raise Unmapped("not a schema object")
        ref = s.get("$ref")
        if isinstance(ref, str):
            return self._ref(ref)
        kind = s.get("type")
        if isinstance(kind, list):
            others = [k for k in kind if k != "null"]
            if len(others) != 1:
                raise Unmapped("several types")
            kind = others[0]
        if kind == "object":
            props = s.get("properties")
            if isinstance(props, dict) and props:
                return struct((str(k), self.of(v)) for k, v in props.items())
            extra = s.get("additionalProperties")
            if isinstance(extra, dict):
                return mapping(Typed(pa.string()), self.of(extra))
            raise Unmapped("an object without properties")
        if kind == "array":
            items = s.get("items")
            if not isinstance(items, dict):
                raise Unmapped("an array without one items schema")
            return array(self.of(items))
        if kind == "string":
            fmt = s.get("format")
            if fmt == "date-time":
                return Typed(pa.timestamp("us", "UTC"), _date_time)
            if fmt == "date":
                return Typed(pa.date32(), _date)
            return Typed(pa.string())
        if kind == "integer":
            return Typed(pa.int64())
        if kind == "number":
            return Typed(pa.float64(), float)
        if kind == "boolean":
            return Typed(pa.bool_())
        raise Unmapped(f"type {kind!r}")

    def _ref(self, ref: str) -> Typed:
        if not ref.startswith("#/") or ref in self.defining:
            raise Unmapped(f"$ref {ref}")
        node: Any = self.root
        for part in ref[2:].split("/"):
            node = node.get(part) if isinstance(node, dict) else None
        self.defining.add(ref)
        try:
            return self._of(node)
        finally:
            self.defining.discard(ref)
