"""The fast format paths (offtake.formats) against confluent-kafka's own serializers and
deserializers, value by value, on a generated corpus, offline (confluent-kafka's in-memory
registry, its ``mock://`` URL).

For every value: what confluent-kafka's serializer writes, our decoder reads as its
deserializer does (one value at a time and in a batch); what our encoder writes is what its
serializer writes (Avro, JSON Schema: the same bytes; Protobuf: the same header and message
index, and a payload that parses to the same message) and what it refuses, ours refuses.

Corpus: CORPUS values per format (a deterministic generator, seeded), plus the edge values.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import struct
import uuid
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka import Message
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf.json_format import MessageToDict, ParseDict
from support.diff_pb import Everything
from support.record_schemas import json_schema

from offtake.config.spec import KafkaSinkSpec, SinkSchemaSpec, SourceSpec
from offtake.formats.errors import SchemaDecodeError
from offtake.formats.resolve import decoder_for, encoder_for

CORPUS = 400
TOPIC = "diff"
CTX = SerializationContext(TOPIC, MessageField.VALUE)

POINT = {
    "type": "record",
    "name": "Point",
    "fields": [{"name": "x", "type": "double"}, {"name": "y", "type": "double"}],
}
AVRO: dict[str, Any] = {
    "type": "record",
    "name": "Everything",
    "namespace": "offtake.diff",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "i", "type": "int"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "flag", "type": "boolean"},
        {"name": "s", "type": "string"},
        {"name": "b", "type": "bytes"},
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
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "t_ms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "t_us", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "ts_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "ts_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
        {"name": "maybe", "type": ["null", "string"], "default": None},
        {"name": "choice", "type": ["null", "long", "string", POINT]},
        {
            "name": "inner",
            "type": {
                "type": "record",
                "name": "Inner",
                "fields": [
                    {"name": "name", "type": "string"},
                    {"name": "tags", "type": {"type": "array", "items": "string"}},
                    {"name": "at", "type": "Point"},
                ],
            },
        },
        {"name": "points", "type": {"type": "array", "items": "Point"}},
        {"name": "attrs", "type": {"type": "map", "values": ["null", "long"]}},
        {"name": "palette", "type": {"type": "map", "values": {"type": "array", "items": "Color"}}},
    ],
}
JSON_SCHEMA = json_schema(
    "Everything",
    {
        "id": {"type": "integer"},
        "amount": {"type": "number", "minimum": 0},
        "name": {"type": "string", "maxLength": 20},
        "flag": {"type": "boolean"},
        "color": {"enum": ["RED", "GREEN", "BLUE"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "at": {
            "type": "object",
            "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
            "required": ["x", "y"],
            "additionalProperties": False,
        },
        "choice": {"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]},
        "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
        "when": {"type": "string", "format": "date-time"},
    },
    ["id", "name"],
)


def _registry() -> SchemaRegistryClient:
    return SchemaRegistryClient.new_client({"url": f"mock://diff-{uuid.uuid4()}"})


def _messages(values: list[bytes]) -> list[Message]:
    return [Message(topic=TOPIC, partition=0, offset=i, value=v) for i, v in enumerate(values)]


def _text(r: random.Random, n: int = 12) -> str:
    return "".join(r.choice("abcdefghijklmnopqrstuvwxyzé€𝄞 ") for _ in range(r.randrange(n)))


def _float32(r: random.Random) -> float:
    return float(struct.unpack("f", struct.pack("f", r.uniform(-1e6, 1e6)))[0])


def _avro_value(r: random.Random) -> dict[str, Any]:
    def point() -> dict[str, float]:
        return {"x": r.uniform(-1e9, 1e9), "y": r.choice([0.0, -0.0, 1e-300, r.random()])}

    utc = dt.UTC
    micros = r.randrange(-(2**40), 2**52)
    choice: Any = r.choice([None, r.randrange(-(2**63), 2**63), _text(r), point()])
    return {
        "id": r.choice([0, -1, 2**63 - 1, -(2**63), r.randrange(-(2**63), 2**63)]),
        "i": r.randrange(-(2**31), 2**31),
        "f": _float32(r),
        "d": r.choice([r.uniform(-1e308, 1e308), 0.1, float("inf"), -float("inf")]),
        "flag": r.random() < 0.5,
        "s": _text(r),
        "b": r.randbytes(r.randrange(16)),
        "dec": Decimal(r.randrange(-(10**12) + 1, 10**12)).scaleb(-3),
        "money": Decimal(r.randrange(-(10**15) + 1, 10**15)).scaleb(-2),
        "day": dt.date(1970, 1, 1) + dt.timedelta(days=r.randrange(-700_000, 2_900_000)),
        "t_ms": dt.time(
            r.randrange(24), r.randrange(60), r.randrange(60), r.randrange(1000) * 1000
        ),
        "t_us": dt.time(r.randrange(24), r.randrange(60), r.randrange(60), r.randrange(10**6)),
        "ts_ms": dt.datetime(1970, 1, 1, tzinfo=utc) + dt.timedelta(milliseconds=micros // 1000),
        "ts_us": dt.datetime(1970, 1, 1, tzinfo=utc) + dt.timedelta(microseconds=micros),
        "uid": uuid.UUID(int=r.getrandbits(128)),
        "color": r.choice(["RED", "GREEN"]),
        "hash": r.randbytes(4),
        "maybe": r.choice([None, _text(r)]),
        "choice": choice,
        "inner": {
            "name": _text(r),
            "tags": [_text(r) for _ in range(r.randrange(4))],
            "at": point(),
        },
        "points": [point() for _ in range(r.randrange(3))],
        "attrs": {_text(r): r.choice([None, r.randrange(-(2**63), 2**63)]) for _ in range(3)},
        "palette": {_text(r): [r.choice(["RED", "GREEN"]) for _ in range(2)] for _ in range(2)},
    }


def _corpus(make: Any, seed: int) -> list[Any]:
    r = random.Random(seed)
    return [make(r) for _ in range(CORPUS)]


def test_avro_reads_and_writes_as_confluent_kafka_does() -> None:
    client = _registry()
    subject = f"{TOPIC}-value"
    client.register_schema(subject, Schema(json.dumps(AVRO), "AVRO"))
    theirs = AvroSerializer(client, json.dumps(AVRO), conf={"auto.register.schemas": False})
    ours = encoder_for(
        KafkaSinkSpec(
            topic=TOPIC,
            delivery="at-least-once",
            auto_register=False,
            format="avro",
            schema=SinkSchemaSpec(subject=subject),
        ),
        client,
    )
    values = _corpus(_avro_value, 24)
    written = [bytes(theirs(v, CTX)) for v in values]
    assert [ours.encode(v) for v in values] == written
    _reads_alike("avro", client, written, AvroDeserializer(client))


def test_avro_of_every_writer_schema_id_and_the_plain_schemas() -> None:
    """Evolution (two versions, two ids, read with each writer's schema), a bare primitive
    schema, and a ``bytes`` schema (which confluent-kafka writes as the bytes themselves)."""
    client = _registry()
    v1 = {"type": "record", "name": "O", "fields": [{"name": "id", "type": "long"}]}
    v2 = {
        **v1,
        "fields": [*v1["fields"], {"name": "n", "type": ["null", "string"], "default": None}],
    }
    written = []
    for schema, value in ((v1, {"id": 1}), (v2, {"id": 2, "n": "x"}), (v1, {"id": 3})):
        written.append(bytes(AvroSerializer(client, json.dumps(schema))(value, CTX)))
    assert written[0][1:5] != written[1][1:5]  # two writer schema ids
    _reads_alike("avro", client, written, AvroDeserializer(client))
    for plain, values in (('"string"', ["", "é", "text"]), ('"bytes"', [b"", b"\x00\xff"])):
        client = _registry()
        theirs = AvroSerializer(client, plain)
        written = [bytes(theirs(v, CTX)) for v in values]
        _reads_alike("avro", client, written, AvroDeserializer(client))
        ours = encoder_for(
            KafkaSinkSpec(
                topic=TOPIC, delivery="at-least-once", auto_register=False, format="avro"
            ),
            client,
        )
        assert [ours.encode(v) for v in values] == written


def test_avro_values_that_do_not_fit_are_refused_by_both() -> None:
    client = _registry()
    client.register_schema(f"{TOPIC}-value", Schema(json.dumps(AVRO), "AVRO"))
    theirs = AvroSerializer(client, json.dumps(AVRO))
    ours = encoder_for(
        KafkaSinkSpec(topic=TOPIC, delivery="at-least-once", auto_register=False, format="avro"),
        client,
    )
    good = _avro_value(random.Random(1))
    for bad in (
        {**good, "id": "one"},
        {**good, "color": "PURPLE"},
        {k: good[k] for k in ("id", "s")},
    ):
        with pytest.raises(Exception):  # noqa: B017 - whatever fastavro raises, both do
            theirs(bad, CTX)
        with pytest.raises(Exception):  # noqa: B017
            ours.encode(bad)


def _json_value(r: random.Random) -> dict[str, Any]:
    value: dict[str, Any] = {"id": r.randrange(-(2**63), 2**63), "name": _text(r, 25)}
    optional: dict[str, Any] = {
        "amount": r.choice([r.uniform(-5, 1e9), 0, r.randrange(10**6)]),
        "flag": r.random() < 0.5,
        "color": r.choice(["RED", "GREEN", "BLUE", "PURPLE"]),
        "tags": [_text(r) for _ in range(r.randrange(3))],
        "at": r.choice([{"x": r.random(), "y": 1}, {"x": 1}, {"x": 1, "y": 2, "z": 3}]),
        "choice": r.choice([None, "s", 7, 1.5, [1]]),
        "attrs": {_text(r): r.choice([1, -(2**40), "x"]) for _ in range(r.randrange(3))},
        "when": r.choice(["2026-11-25T00:00:00Z", "not a date"]),
        "unknown": {"nested": [None, True]},
    }
    for key, v in optional.items():
        if r.random() < 0.6:
            value[key] = v
    if r.random() < 0.05:
        del value["id"]
    return value


def test_json_schema_reads_writes_and_refuses_as_confluent_kafka_does() -> None:
    client = _registry()
    subject = f"{TOPIC}-value"
    client.register_schema(subject, Schema(json.dumps(JSON_SCHEMA), "JSON"))
    theirs = JSONSerializer(json.dumps(JSON_SCHEMA), client, conf={"auto.register.schemas": False})
    ours = encoder_for(
        KafkaSinkSpec(
            topic=TOPIC, delivery="at-least-once", auto_register=False, format="jsonschema"
        ),
        client,
    )
    written, refused = [], 0
    for value in _corpus(_json_value, 27):
        try:
            expected = bytes(theirs(value, CTX))
        except Exception:
            refused += 1
            with pytest.raises(ValueError, match=r"."):
                ours.encode(value)
            continue
        assert ours.encode(value) == expected
        written.append(expected)
    assert 50 < refused < CORPUS - 50, refused  # the corpus has both kinds, many of each
    # Values that do not validate against the writer's schema, written around the serializer:
    # both readers refuse them.
    header = written[0][:5]
    invalid = [header + json.dumps(v).encode() for v in ({"id": "x", "name": ""}, {"name": 1})]
    _reads_alike(
        "jsonschema",
        client,
        written + invalid,
        JSONDeserializer(None, schema_registry_client=client),
    )


def _pb_value(r: random.Random) -> Any:
    m = Everything()
    m.id = r.randrange(-(2**63), 2**63)
    m.i = r.randrange(-(2**31), 2**31)
    m.u = r.randrange(2**64)
    m.s = r.randrange(-(2**63), 2**63)
    m.f = _float32(r)
    m.d = r.choice([0.0, r.uniform(-1e300, 1e300), float("inf")])
    m.flag = r.random() < 0.5
    m.text = _text(r)
    m.blob = r.randbytes(r.randrange(8))
    m.color = r.randrange(3)
    if r.random() < 0.7:
        m.point.x, m.point.y = r.random(), -r.random()
        if r.random() < 0.5:
            m.point.tag.name = _text(r)
    for _ in range(r.randrange(3)):
        m.points.add(x=r.random())
    m.numbers.extend(r.randrange(-(2**63), 2**63) for _ in range(r.randrange(4)))
    for _ in range(r.randrange(3)):
        m.counts[_text(r)] = r.randrange(-(2**40), 2**40)
    for _ in range(r.randrange(3)):
        m.by_id[r.randrange(-100, 100)].y = r.random()
    which = r.randrange(4)
    if which == 0:
        m.name = _text(r)
    elif which == 1:
        m.number = r.randrange(-(2**63), 2**63)
    elif which == 2:
        m.at.x = r.random()
    if r.random() < 0.7:
        m.placed.seconds = r.randrange(-62135596800, 253402300799)
        m.placed.nanos = r.choice([0, r.randrange(10**9), r.randrange(1000) * 10**6])
    if r.random() < 0.7:
        m.took.seconds = r.randrange(-315576000000, 315576000000)
        m.took.nanos = (
            0 if m.took.seconds == 0 else (1 if m.took.seconds > 0 else -1) * r.randrange(10**9)
        )
    for field, make in (
        ("maybe_long", lambda: r.randrange(-(2**63), 2**63)),
        ("maybe_text", lambda: _text(r)),
        ("maybe_flag", lambda: r.random() < 0.5),
        ("maybe_double", lambda: r.uniform(-1e6, 1e6)),
        ("maybe_blob", lambda: r.randbytes(3)),
    ):
        if r.random() < 0.5:
            getattr(m, field).value = make()
    if r.random() < 0.6:
        m.extra.update({_text(r): r.choice([None, 1.5, "s", True, [1, "x"], {"k": {"n": 2}}])})
    if r.random() < 0.5:
        m.opt = r.choice(["", _text(r)])
    return m


def test_protobuf_reads_and_writes_as_confluent_kafka_does() -> None:
    client = _registry()
    theirs = ProtobufSerializer(Everything, client, {"use.deprecated.format": False})
    messages = _corpus(_pb_value, 30)
    written = [bytes(theirs(m, CTX)) for m in messages]
    assert written[0][5:6] == b"\x02\x02"[:1]  # the message index is [1]: not the short form
    deserializer = ProtobufDeserializer(Everything, {}, client)
    _reads_alike(
        "protobuf",
        client,
        written,
        lambda raw, ctx: MessageToDict(deserializer(raw, ctx), **_PB_TO_DICT),
    )
    ours = encoder_for(
        KafkaSinkSpec(
            topic=TOPIC,
            delivery="at-least-once",
            auto_register=False,
            format="protobuf",
            protobuf_message="support.diff_pb:Everything",
        ),
        client,
    )
    decoder = decoder_for(_source("protobuf"), client)
    for message, expected in zip(messages, written, strict=True):
        value = decoder.value(expected, TOPIC)
        mine = ours.encode(value)
        assert mine is not None
        their_bytes = bytes(theirs(ParseDict(value, Everything()), CTX))
        start = len(their_bytes) - len(ParseDict(value, Everything()).SerializeToString())
        assert mine[:start] == their_bytes[:start] == expected[:start]
        assert Everything.FromString(mine[start:]) == message


_PB_TO_DICT = {"preserving_proto_field_name": True, "always_print_fields_with_no_presence": True}
try:
    MessageToDict(Everything(), unquote_int64_if_possible=True)
    _PB_TO_DICT["unquote_int64_if_possible"] = True
except TypeError:
    pass


def _source(fmt: str) -> SourceSpec:
    return SourceSpec(
        topics=(TOPIC,),
        group_id="g",
        group_type="consumer",
        start_from="earliest",
        format=fmt,  # type: ignore[arg-type]
        protobuf_message="support.diff_pb:Everything" if fmt == "protobuf" else None,
    )


def _reads_alike(fmt: str, client: SchemaRegistryClient, written: list[bytes], theirs: Any) -> None:
    """Each value read by ``theirs`` equals ours, one at a time and in a batch; a value theirs
    refuses, ours refuses as a schema mismatch naming its schema id."""
    decoder = decoder_for(_source(fmt), client)
    batch = decoder.records(_messages(written), TOPIC, 0)
    agreed = refused = 0
    for raw, (record, error) in zip(written, batch, strict=True):
        try:
            expected = theirs(raw, CTX)
        except Exception:
            with pytest.raises(SchemaDecodeError) as mine:
                decoder.value(raw, TOPIC)
            assert mine.value.headers["offtake.error.reason"] == "schema-mismatch"
            assert mine.value.schema_id == int.from_bytes(raw[1:5], "big")
            assert error is not None and record.value is None
            refused += 1
            continue
        assert decoder.value(raw, TOPIC) == expected
        assert error is None and record.value == expected
        assert type(record.value) is type(expected)
        agreed += 1
    assert agreed > 0


def test_a_schema_with_references_is_read_by_confluent_kafkas_own_deserializer() -> None:
    """What the fast path does not implement (references, rule sets, inline rules) is read by
    confluent-kafka's deserializer for that schema id: the same values, nothing refused."""
    from confluent_kafka.schema_registry import SchemaReference

    client = _registry()
    client.register_schema("point", Schema(json.dumps({**POINT, "namespace": "p"}), "AVRO"))
    line = {
        "type": "record",
        "name": "Line",
        "fields": [{"name": "a", "type": "p.Point"}, {"name": "b", "type": "p.Point"}],
    }
    schema = Schema(json.dumps(line), "AVRO", [SchemaReference("p.Point", "point", 1)])
    client.register_schema(f"{TOPIC}-value", schema)
    theirs = AvroSerializer(client, schema, conf={"auto.register.schemas": False})
    values = [{"a": {"x": i, "y": -i}, "b": {"x": 0.5, "y": i / 3}} for i in range(20)]
    written = [bytes(theirs(v, CTX)) for v in values]
    _reads_alike("avro", client, written, AvroDeserializer(client))
