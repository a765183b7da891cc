"""offtake.formats.avro_fast against fastavro, which it stands in for on the hot path.

Its rule: a closure gives exactly what fastavro's ``schemaless_reader``/``schemaless_writer``
give, or raises (and then fastavro answers). Held here on a generated corpus of values for
schemas of every Avro type, on those values' bytes mutated (cut, flipped, extended, hostile
varints), and on values of neighbouring Python types; and through AvroDecoder and AvroEncoder,
whose answer must be fastavro's, value or error, every time.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import math
import random
import uuid
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema
from fastavro import schemaless_reader, schemaless_writer

from offtake.formats import avro_fast, avro_readers
from offtake.formats.avro import AvroDecoder, AvroEncoder, parsed
from offtake.formats.avro_fast import build_reader, build_writer
from offtake.formats.errors import NotFast, OutOfBounds, SchemaDecodeError

VALUES = 300
UTC = dt.UTC

COLOR = {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}
POINT = {
    "type": "record",
    "name": "Point",
    "fields": [{"name": "x", "type": "double"}, {"name": "y", "type": "float"}],
}
SCHEMAS: dict[str, Any] = {
    "flat": {
        "type": "record",
        "name": "Order",
        "namespace": "t",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "n", "type": "int"},
            {"name": "customer", "type": "string"},
            {"name": "amount", "type": "double"},
            {"name": "ratio", "type": "float"},
            {"name": "ok", "type": "boolean"},
            {"name": "blob", "type": "bytes"},
            {"name": "nothing", "type": "null"},
        ],
    },
    "optional": {
        "type": "record",
        "name": "Opt",
        "fields": [
            {"name": "a", "type": ["null", "string"]},
            {"name": "b", "type": ["long", "null"]},
            {"name": "c", "type": ["null", POINT]},
            {"name": "d", "type": ["null", {"type": "array", "items": "int"}]},
            {"name": "e", "type": ["null", {"type": "map", "values": "double"}]},
            {"name": "f", "type": ["null", COLOR]},
        ],
    },
    "nested": {
        "type": "record",
        "name": "Nested",
        "namespace": "t.n",
        "fields": [
            {"name": "color", "type": COLOR},
            {"name": "again", "type": "Color"},
            {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
            {"name": "points", "type": {"type": "array", "items": POINT}},
            {"name": "where", "type": "Point"},
            {
                "name": "tags",
                "type": {"type": "map", "values": {"type": "array", "items": "string"}},
            },
            {"name": "java", "type": {"type": "string", "avro.java.string": "String"}},
        ],
    },
    "logical": {
        "type": "record",
        "name": "Times",
        "fields": [
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "ts_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "ts_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "t_ms", "type": {"type": "int", "logicalType": "time-millis"}},
            {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
            {
                "name": "dec",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3},
            },
            {
                "name": "money",
                "type": {
                    "type": "fixed",
                    "name": "Money",
                    "size": 8,
                    "logicalType": "decimal",
                    "precision": 15,
                    "scale": 2,
                },
            },
            {"name": "odd", "type": {"type": "long", "logicalType": "not-a-known-type"}},
        ],
    },
    "choices": {
        "type": "record",
        "name": "Choices",
        "fields": [
            {"name": "choice", "type": ["null", "long", "string", POINT, "boolean", "bytes"]},
            {"name": "many", "type": {"type": "array", "items": ["double", COLOR, "null"]}},
            {"name": "ts", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]},
            {"name": "uid", "type": [{"type": "string", "logicalType": "uuid"}, "null"]},
            {
                "name": "dec",
                "type": [
                    "null",
                    {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
                ],
            },
        ],
    },
    "ambiguous": {  # a value two branches take: fastavro's validation picks, so it writes it
        "type": "record",
        "name": "Ambiguous",
        "fields": [
            {"name": "number", "type": ["null", "int", "long", "float", "double"]},
            {
                "name": "word",
                "type": ["null", "string", {"type": "enum", "name": "W", "symbols": ["A"]}],
            },
            {"name": "when", "type": ["null", "long", {"type": "int", "logicalType": "date"}]},
            {"name": "shape", "type": ["null", POINT, {"type": "map", "values": "double"}]},
        ],
    },
    "top-union": ["null", "string", "long"],
    "top-string": "string",
    # Zero-width items: read by the closures, with the value's budget of such items.
    "array of nulls": {"type": "array", "items": "null"},
    "array of empty records": {
        "type": "array",
        "items": {"type": "record", "name": "E", "fields": []},
    },
    "arrays of zero-width items": {
        "type": "record",
        "name": "Z",
        "fields": [
            {
                "name": "f",
                "type": {"type": "array", "items": {"type": "fixed", "name": "F0", "size": 0}},
            },
            {"name": "n", "type": {"type": "array", "items": {"type": "array", "items": "null"}}},
        ],
    },
}
NOT_BUILT = {
    "recursive": (  # written by the closures while its next is None, by fastavro after
        {
            "type": "record",
            "name": "Node",
            "fields": [
                {"name": "v", "type": "long"},
                {"name": "next", "type": ["null", "Node"]},
            ],
        },
        "reader",
    ),
}


def _value(schema: Any, named: dict[str, Any], rng: random.Random, depth: int = 0) -> Any:
    if isinstance(schema, list):
        return _value(rng.choice(schema), named, rng, depth)
    if isinstance(schema, str):
        if schema in named:
            return _value(named[schema], named, rng, depth)
        schema = {"type": schema}
    kind, logical = schema["type"], schema.get("logicalType")
    if isinstance(schema.get("name"), str):
        named.setdefault(schema["name"], schema)
        named.setdefault(schema["name"].rsplit(".", 1)[-1], schema)
    if logical == "date":
        return dt.date(1970, 1, 1) + dt.timedelta(days=rng.randint(-3000, 30000))
    if logical in ("timestamp-millis", "timestamp-micros"):
        micros = rng.randint(-(10**15), 10**16)
        if logical == "timestamp-millis":
            micros -= micros % 1000
        return dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=micros)
    if logical == "time-millis":
        return (dt.datetime.min + dt.timedelta(milliseconds=rng.randrange(86_400_000))).time()
    if logical == "uuid":
        return uuid.UUID(int=rng.getrandbits(128))
    if logical == "decimal":
        digits = rng.randint(-(10 ** (schema["precision"] - 1)), 10 ** (schema["precision"] - 1))
        return Decimal(digits).scaleb(-schema["scale"])
    if kind == "null":
        return None
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "int":
        return rng.choice([0, 1, -1, 63, 64, -65, 2**31 - 1, -(2**31), rng.randint(-999, 999)])
    if kind == "long":
        return rng.choice([0, -1, 63, 64, 2**63 - 1, -(2**63), rng.randint(-(2**40), 2**40)])
    if kind == "float":
        return rng.choice([0.0, -0.0, 1.5, math.inf, -math.inf, rng.uniform(-1e6, 1e6)])
    if kind == "double":
        return rng.choice([0.0, -0.0, 1e308, 5e-324, math.inf, rng.uniform(-1e12, 1e12)])
    if kind == "string":
        return "".join(rng.choice("aZ9 é€𝄞\x00") for _ in range(rng.choice([0, 1, 5, 63, 64, 200])))
    if kind == "bytes":
        return rng.randbytes(rng.choice([0, 1, 63, 64, 300]))
    if kind == "fixed":
        return rng.randbytes(schema["size"])
    if kind == "enum":
        return rng.choice(schema["symbols"])
    if kind == "array":
        return [_value(schema["items"], named, rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if kind == "map":
        return {
            f"k{i}": _value(schema["values"], named, rng, depth + 1)
            for i in range(rng.randint(0, 4))
        }
    return {f["name"]: _value(f["type"], named, rng, depth + 1) for f in schema["fields"]}


def _fa_write(schema: Any, value: Any) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, schema, value)
    return out.getvalue()


def _fa_read(schema: Any, data: bytes) -> Any:
    return schemaless_reader(io.BytesIO(data), schema, None)


def _corpus(name: str) -> tuple[Any, list[Any]]:
    schema = parsed(json.dumps(SCHEMAS[name]))
    rng = random.Random(f"avro-fast-{name}")
    named: dict[str, Any] = {}
    return schema, [_value(SCHEMAS[name], named, rng) for _ in range(VALUES)]


def _same(a: Any, b: Any) -> bool:
    # NaN is not equal to itself: compare floats by their bits' meaning
    return repr(a) == repr(b)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_closures_read_what_fastavro_wrote_as_fastavro_reads_it(name: str) -> None:
    schema, values = _corpus(name)
    read = build_reader(schema)
    assert read is not None, f"{name}: no closures built"
    for value in values:
        data = _fa_write(schema, value)
        got, end = read(data, 0)
        assert _same(got, _fa_read(schema, data)), (name, value)
        assert end == len(data)


@pytest.mark.parametrize("name", sorted(set(SCHEMAS) - {"ambiguous"}))
def test_closures_write_the_bytes_fastavro_writes(name: str) -> None:
    schema, values = _corpus(name)
    write = build_writer(schema)
    assert write is not None, f"{name}: no closures built"
    for value in values:
        out = bytearray()
        write(value, out)
        assert bytes(out) == _fa_write(schema, value), (name, value)


def test_a_union_value_two_branches_take_is_left_to_fastavro() -> None:
    schema, values = _corpus("ambiguous")
    write = build_writer(schema)
    assert write is not None
    written = left = 0
    for value in [{"number": None, "word": None, "when": None, "shape": None}, *values]:
        out = bytearray()
        try:
            write(value, out)
        except Exception:
            left += 1
            continue
        assert bytes(out) == _fa_write(schema, value)
        written += 1
    assert written and left  # all-None (or a float...) rows by the closures, the rest by fastavro
    for number in (1, 2**40, 1.5):  # fastavro picks int, long, float: not the closures' to say
        value = {"number": number, "word": None, "when": None, "shape": None}
        with pytest.raises(NotFast):
            write(value, bytearray())
        _fa_write(schema, value)
    # a date only the logical branch takes; an int the long and (prepared) the date branch take
    value = {"number": None, "word": None, "when": dt.date(2026, 11, 26), "shape": None}
    out = bytearray()
    write(value, out)
    assert bytes(out) == _fa_write(schema, value)
    with pytest.raises(NotFast):
        write(dict(value, when=5), bytearray())


def test_a_recursive_type_is_written_by_the_closures_up_to_its_recursion() -> None:
    schema = parsed(json.dumps(NOT_BUILT["recursive"][0]))
    write = build_writer(schema)
    assert write is not None
    out = bytearray()
    write({"v": 1, "next": None}, out)
    assert bytes(out) == _fa_write(schema, {"v": 1, "next": None})
    with pytest.raises(NotFast):
        write({"v": 1, "next": {"v": 2, "next": None}}, bytearray())


@pytest.mark.parametrize("name", sorted(NOT_BUILT))
def test_schemas_the_closures_do_not_take_are_fastavros(name: str) -> None:
    schema, side = NOT_BUILT[name]
    schema = parsed(json.dumps(schema))
    assert build_reader(schema) is None
    assert (build_writer(schema) is None) == (side == "both")


@pytest.mark.parametrize("size", [-1, "4", 4.5, True, None])
def test_a_fixed_size_fastavro_parses_but_no_reader_could_is_left_to_it(size: Any) -> None:
    schema = parsed(json.dumps({"type": "fixed", "name": "F", "size": size}))
    assert build_reader(schema) is None
    assert build_writer(schema) is None


def _mutations(data: bytes, rng: random.Random) -> list[bytes]:
    out = [data[:cut] for cut in range(len(data))]  # every truncation
    for _ in range(20):
        flipped = bytearray(data or b"\0")
        flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        out.append(bytes(flipped))
    out += [data + b"\x00", data + b"\xff" * 3]
    out += [b"\xff" * 11 + data, b"\x80" * 9 + b"\x7f" + data, b"\x01" + data]  # hostile varints
    out += [b"\x81\x80\x80\x80\x80\x80\x80\x80\x80\x01" + data]  # a count of -2**63
    return out


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_on_mutated_bytes_the_closures_agree_with_fastavro_or_raise(name: str) -> None:
    schema, values = _corpus(name)
    read = build_reader(schema)
    assert read is not None
    rng = random.Random(f"mutate-{name}")
    agreed = raised = 0
    for value in values[:60]:
        for data in _mutations(_fa_write(schema, value), rng):
            try:
                got = read(data, 0)[0]
            except Exception:
                raised += 1
                continue
            expected = _fa_read(schema, data)  # must not raise where the closures did not
            assert _same(got, expected), (name, data)
            agreed += 1
    assert agreed and raised  # both sides of the rule were exercised


class _Dict(dict[str, Any]):
    pass


class _Str(str):
    pass


ODD_FIELDS: list[tuple[str, Any]] = [
    ("id", True),
    ("id", 1.0),
    ("id", 2**63),
    ("id", -(2**63) - 1),
    ("n", 2**31),
    ("n", -(2**31) - 1),
    ("n", False),
    ("amount", 3),
    ("amount", "NaN"),
    ("amount", True),
    ("ratio", math.nan),
    ("ratio", 1e39),
    ("ratio", 2),
    ("ok", 1),
    ("ok", None),
    ("customer", _Str("x")),
    ("customer", b"x"),
    ("customer", "\ud800"),
    ("blob", bytearray(b"x")),
    ("blob", "x"),
    ("nothing", 0),
]


@pytest.mark.parametrize(("field", "odd"), ODD_FIELDS, ids=[f"{f}={v!r}" for f, v in ODD_FIELDS])
def test_odd_values_are_written_as_fastavro_writes_them_or_left_to_it(field: str, odd: Any) -> None:
    schema, values = _corpus("flat")
    write = build_writer(schema)
    assert write is not None
    value = dict(values[0], **{field: odd})
    _agree_or_raise(write, schema, value)


def _agree_or_raise(write: Any, schema: Any, value: Any) -> None:
    out = bytearray()
    try:
        write(value, out)
    except Exception:
        return
    assert bytes(out) == _fa_write(schema, value)


@pytest.mark.parametrize(
    "odd",
    [
        {"a": None, "b": None, "c": {"x": 1.0, "y": 2.0, "-type": "Other"}},
        {"a": None, "b": None, "c": {"x": 1.0, "y": 2.0, "-type": "Point"}},
        {"a": ("string", "x")},
        {"c": {"x": 1.0}},
        {"c": _Dict(x=1.0, y=2.0)},
        {"d": (1, 2)},
        {"d": [2**31]},
        {"e": {1: 1.0}},
        {"f": "PURPLE"},
        {"b": True},
    ],
)
def test_odd_values_below_a_union_are_fastavros_to_validate(odd: dict[str, Any]) -> None:
    schema, values = _corpus("optional")
    write = build_writer(schema)
    assert write is not None
    _agree_or_raise(write, schema, dict(values[0], **odd))


def test_missing_and_extra_fields_are_written_as_fastavro_writes_them() -> None:
    schema, values = _corpus("flat")
    write = build_writer(schema)
    assert write is not None
    extra = dict(values[1], unknown="ignored")
    _agree_or_raise(write, schema, extra)
    out = bytearray()
    write(extra, out)  # an extra key is ignored by both
    missing = dict(values[1])
    del missing["customer"]
    with pytest.raises(KeyError):
        write(missing, bytearray())  # fastavro's to refuse, with its message


# fastavro's answers to a value that ends before its schema's fields do. The decoder answers
# those with OutOfBounds ("the value ends at byte N ..."), its record's decode error, instead
# of handing the value to fastavro, which reads past its buffer's end as zeros and on some
# values loops through a claimed count for minutes (formats/avro.py).
ENDED_EARLY = ("EOFError", "IndexError")


def _outcome(call: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "value", call(*args)
    except Exception as exc:
        return "error", type(exc).__name__


@pytest.mark.parametrize("name", ["flat", "nested", "logical", "choices"])
def test_the_decoder_answers_as_fastavro_on_every_mutation(name: str) -> None:
    schema, values = _corpus(name)
    read = AvroDecoder.reader(
        AvroDecoder.__new__(AvroDecoder), Schema(json.dumps(SCHEMAS[name]), "AVRO")
    )
    rng = random.Random(f"decoder-{name}")
    for value in values[:30]:
        for data in _mutations(_fa_write(schema, value), rng):
            ours = _outcome(read, b"\x00\x00\x00\x00\x01" + data, "t")
            if not data:
                assert ours == ("error", "ValueError")  # no payload: as confluent-kafka's
                continue
            theirs = _outcome(_fa_read, schema, data)
            if ours == ("error", "OutOfBounds") and theirs[1] in ENDED_EARLY:
                continue  # both say the value ended early; ours never runs fastavro past its end
            assert ours[0] == theirs[0] and _same(ours[1], theirs[1]), (name, data)


@pytest.mark.parametrize("name", ["flat", "optional", "choices", "ambiguous"])
def test_the_encoder_answers_as_fastavro(name: str) -> None:
    schema, values = _corpus(name)
    encoder = AvroEncoder(json.dumps(SCHEMAS[name]), 7)
    odd = [dict(values[0], **{f: v}) for f, v in ODD_FIELDS] if name == "flat" else []
    for value in values + odd:
        ours = _outcome(encoder.encode, value)
        theirs = _outcome(lambda v: b"\x00\x00\x00\x00\x07" + _fa_write(schema, v), value)
        assert ours == theirs, (name, value)


def _nested(depth: int) -> dict[str, Any]:
    """Records each holding the next level twice, inline and by name: 2**depth references."""
    level: dict[str, Any] = {
        "type": "record",
        "name": f"L{depth}",
        "fields": [{"name": "v", "type": "int"}],
    }
    for k in range(depth - 1, -1, -1):
        level = {
            "type": "record",
            "name": f"L{k}",
            "fields": [
                {"name": "a", "type": ["null", level]},
                {"name": "b", "type": ["null", f"L{k + 1}"]},
            ],
        }
    return level


def test_a_named_type_is_built_once_however_often_it_is_referred_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: every reference rebuilt its type, 2.8x the time a level (14 levels: 14.7 s).
    depth = 40
    schema = parsed(json.dumps(_nested(depth)))
    built: list[str] = []
    for name in ("reader_record", "writer_record"):
        real = getattr(avro_fast, name)
        monkeypatch.setattr(
            avro_fast, name, lambda *a, _real=real, _name=name: built.append(_name) or _real(*a)
        )
    read, write = build_reader(schema), build_writer(schema)
    assert read is not None and write is not None
    assert built.count("reader_record") == depth + 1
    # the writer: each record once outside a union's validation, once inside
    assert built.count("writer_record") <= 2 * (depth + 1)
    value = {"a": None, "b": {"a": None, "b": None}}
    data = _fa_write(schema, value)
    assert read(data, 0)[0] == _fa_read(schema, data) == value
    out = bytearray()
    write(value, out)
    assert bytes(out) == data


def _zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _OneSchema:
    def __init__(self, schema: Any) -> None:
        self._schema = Schema(json.dumps(schema), "AVRO")

    def get_schema(self, schema_id: int, **kwargs: Any) -> Schema:
        return self._schema


@pytest.mark.parametrize(
    "name", ["array of nulls", "array of empty records", "arrays of zero-width items"]
)
def test_zero_width_items_past_the_values_budget_fail_that_value_alone(name: str) -> None:
    # Before: 13 bytes claiming 2**40 nulls appended until memory ran out (24 s to a MemoryError
    # under a 1 GiB cap), fastavro reading what the closures handed over.
    schema = parsed(json.dumps(SCHEMAS[name]))
    read = build_reader(schema)
    assert read is not None
    claim = _zigzag(1 << 40) + b"\x00"
    if name == "arrays of zero-width items":
        hostile = [_zigzag(0) + _zigzag(1) + claim + b"\x00", claim]
        many = [_zigzag(0) + _zigzag(2000) + (_zigzag(3000) + b"\x00") * 2000 + b"\x00"]
    else:
        hostile = [claim, _zigzag(-(1 << 40)) + _zigzag(0) + b"\x00"]
        many = [_zigzag(3000) + _zigzag(3000) + b"\x00"]  # two blocks: 6,000 > 4,096 in all
    for data in hostile + many:
        with pytest.raises(OutOfBounds, match="zero-width items"):
            read(data, 0)
    # within the budget: the value fastavro reads
    fine = _zigzag(avro_readers.ZERO_WIDTH_ITEMS_FLOOR) + b"\x00"
    if name != "arrays of zero-width items":
        assert read(fine, 0)[0] == _fa_read(schema, fine)
    decoder = AvroDecoder(_OneSchema(SCHEMAS[name]))
    with pytest.raises(SchemaDecodeError) as failed:
        decoder.value(b"\x00\x00\x00\x00\x07" + hostile[0], "t")
    assert failed.value.headers == {
        "offtake.schema.id": "7",
        "offtake.error.reason": "out-of-bounds",
    }
