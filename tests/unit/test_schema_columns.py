"""The writer's schema as typed columns, without Spark: what has no column type becomes JSON
text, nested records grow compatibly, a type change anywhere names its field path and both
schema ids, and values a processor reshaped fall back to inferred columns. Records are encoded
by confluent-kafka's serializers into its own in-memory registry (offtake.testing)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from offtake.sinks.spark.schema_columns import SchemaChangeError, TypedColumns
from offtake.sinks.spark.schema_types import avro_columns, jsonschema_columns
from offtake.testing import encode, in_memory_registry


def _record(fields: list[dict[str, Any]], name: str = "R") -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": fields}


def test_avro_parts_without_a_column_type_are_json_text_and_the_rest_keeps_its_types() -> None:
    node = _record(
        [{"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"]}], "Node"
    )
    schema = _record(
        [
            {"name": "many", "type": ["null", "int", "string"]},
            {"name": "node", "type": node},
            {
                "name": "huge",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2},
            },
            {"name": "at", "type": {"type": "int", "logicalType": "time-millis"}},
            {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "raw", "type": {"type": "fixed", "name": "F", "size": 2}},
            {"name": "again", "type": "F"},
        ]
    )
    cols = {c.name: c for c in avro_columns(json.dumps(schema))}
    assert cols["many"].type == pa.string() and cols["many"].convert is not None
    assert cols["many"].convert(7) == "7"
    node_type = cols["node"].type
    assert node_type.field("v").type == pa.int32()  # the recursive part alone is text
    assert node_type.field("next").type == pa.string()
    assert cols["huge"].type == pa.string()  # past Spark's 38 digits
    assert cols["at"].type == pa.string() and cols["uid"].type == pa.string()
    assert cols["raw"].type == pa.binary() and cols["again"].type == pa.binary()


def test_json_schema_refs_maps_and_alternatives() -> None:
    schema = {
        "type": "object",
        "definitions": {"money": {"type": "object", "properties": {"cents": {"type": "integer"}}}},
        "properties": {
            "price": {"$ref": "#/definitions/money"},
            "either": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "tags": {"type": "object", "additionalProperties": {"type": "integer"}},
            "maybe": {"type": ["null", "number"]},
        },
    }
    cols = {c.name: c for c in jsonschema_columns(json.dumps(schema))}
    assert cols["price"].type == pa.struct([("cents", pa.int64())])
    assert cols["either"].type == pa.string()
    assert cols["tags"].type == pa.map_(pa.string(), pa.int64())
    assert cols["maybe"].type == pa.float64()


V1 = _record(
    [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": _record([{"name": "name", "type": "string"}], "C")},
    ]
)
V2 = _record(
    [
        {"name": "id", "type": "long"},
        {
            "name": "customer",
            "type": _record(
                [
                    {"name": "name", "type": "string"},
                    {"name": "tier", "type": ["null", "string"], "default": None},
                ],
                "C",
            ),
        },
    ]
)


def _typed() -> tuple[TypedColumns, Any]:
    registry = in_memory_registry()
    return TypedColumns("avro", registry), registry


def test_a_nested_new_field_grows_the_struct_and_older_rows_have_it_null() -> None:
    typed, registry = _typed()
    topic = "grow"
    raws = [
        encode("avro", {"id": 1, "customer": {"name": "a"}}, V1, registry=registry, topic=topic),
        encode(
            "avro",
            {"id": 2, "customer": {"name": "b", "tier": "gold"}},
            V2,
            registry=registry,
            topic=topic,
        ),
    ]
    values = [
        {"id": 1, "customer": {"name": "a"}},
        {"id": 2, "customer": {"name": "b", "tier": "gold"}},
    ]
    columns = typed.columns(values, raws)
    assert columns is not None
    table = pa.Table.from_arrays([a for _, a in columns], names=[n for n, _ in columns])
    assert table.schema.field("customer").type == pa.struct(
        [("name", pa.string()), ("tier", pa.string())]
    )
    assert table.column("customer").to_pylist() == [
        {"name": "a", "tier": None},
        {"name": "b", "tier": "gold"},
    ]


def test_a_nested_type_change_names_the_field_path_and_both_schema_ids() -> None:
    typed, registry = _typed()
    v1 = encode("avro", {"id": 1, "customer": {"name": "a"}}, V1, registry=registry, topic="t1")
    assert typed.columns([{"id": 1, "customer": {"name": "a"}}], [v1]) is not None
    changed = _record(
        [
            {"name": "id", "type": "long"},
            {"name": "customer", "type": _record([{"name": "name", "type": "long"}], "C")},
        ]
    )
    v9 = encode("avro", {"id": 2, "customer": {"name": 5}}, changed, registry=registry, topic="t9")
    with pytest.raises(SchemaChangeError) as caught:
        typed.columns([{"id": 2, "customer": {"name": 5}}], [v9])
    text = str(caught.value)
    ids = [int.from_bytes(r[1:5], "big") for r in (v1, v9)]
    assert "'customer.name'" in text
    assert f"schema id {ids[1]}" in text and f"schema id {ids[0]}" in text
    assert typed.table_types["customer"] == pa.struct([("name", pa.string())])  # unchanged


def test_values_a_processor_reshaped_fall_back_to_inferred_columns() -> None:
    typed, registry = _typed()
    raw = encode("avro", {"id": 1, "customer": {"name": "a"}}, V1, registry=registry, topic="p")
    enriched = {"id": 1, "customer": {"name": "a"}, "score": 0.5}  # a field V1 does not have
    assert typed.columns([enriched], [raw]) is None
    nested = {"id": 1, "customer": {"name": "a", "vip": True}}
    assert typed.columns([nested], [raw]) is None
    assert typed.columns(["just text"], [raw]) is None


def test_a_registry_that_cannot_be_reached_is_a_sink_outage_not_a_bad_batch() -> None:
    from offtake.config.spec import SchemaRegistrySpec
    from offtake.formats.errors import RegistryUnavailable
    from offtake.schema_registry import make_client
    from offtake.sinks.spark.errors import unavailable
    from offtake_testbed.process import free_port

    port = free_port()  # closed again: nothing listens
    typed = TypedColumns("avro", make_client(SchemaRegistrySpec(f"http://127.0.0.1:{port}")))
    with pytest.raises(RegistryUnavailable) as caught:
        typed.columns([{"id": 1}], [b"\x00\x00\x00\x00\x07payload"])
    assert unavailable(caught.value) is not None  # the Spark sink waits it out, attempts unspent
