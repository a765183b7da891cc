"""The schemas of bench/passthrough.py's schema'd workloads (avro, protobuf, jsonschema),
written once and imported by every contender (Offtake's worker, the loop, Quix Streams).

Input records are the bench's JSON records (id, customer, amount, pad) in the format; the
output is what ``bench_workloads.enrich`` makes of them (two fields more). The protobuf classes
are built from their descriptors at import time (no protoc), with the protobuf runtime of
whichever environment imports this file.
"""

from __future__ import annotations

import json
from typing import Any

AVRO_IN: dict[str, Any] = {
    "type": "record",
    "name": "BenchOrder",
    "namespace": "offtake.bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "pad", "type": "string"},
    ],
}
AVRO_OUT: dict[str, Any] = {
    **AVRO_IN,
    "name": "BenchOrderOut",
    "fields": [
        *AVRO_IN["fields"],
        {"name": "amount_cents", "type": "long"},
        {"name": "large", "type": "boolean"},
    ],
}


def _json_schema(title: str, extra: dict[str, Any]) -> dict[str, Any]:
    properties = {
        "id": {"type": "integer"},
        "customer": {"type": "string"},
        "amount": {"type": "number"},
        "pad": {"type": "string"},
        **extra,
    }
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": title,
        "type": "object",
        "properties": properties,
        "required": sorted(properties),
    }


JSON_SCHEMA_IN = _json_schema("BenchOrder", {})
JSON_SCHEMA_OUT = _json_schema(
    "BenchOrderOut", {"amount_cents": {"type": "integer"}, "large": {"type": "boolean"}}
)
SCHEMAS = {
    "avro": (json.dumps(AVRO_IN), json.dumps(AVRO_OUT)),
    "jsonschema": (json.dumps(JSON_SCHEMA_IN), json.dumps(JSON_SCHEMA_OUT)),
}
PROTOBUF_IN = "bench_schemas:BenchOrder"
PROTOBUF_OUT = "bench_schemas:BenchOrderOut"


def _protobuf_classes() -> tuple[Any, Any]:
    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf.message_factory import GetMessageClass

    f = descriptor_pb2.FieldDescriptorProto
    pool = descriptor_pool.Default()
    try:
        pool.FindMessageTypeByName("offtake.bench.BenchOrder")
    except KeyError:
        fd = descriptor_pb2.FileDescriptorProto(
            name="offtake_bench.proto", package="offtake.bench", syntax="proto3"
        )
        fields = [
            ("id", f.TYPE_INT64),
            ("customer", f.TYPE_STRING),
            ("amount", f.TYPE_DOUBLE),
            ("pad", f.TYPE_STRING),
        ]
        for name, more in (
            ("BenchOrder", []),
            ("BenchOrderOut", [("amount_cents", f.TYPE_INT64), ("large", f.TYPE_BOOL)]),
        ):
            message = fd.message_type.add(name=name)
            for number, (field, kind) in enumerate([*fields, *more], start=1):
                message.field.add(name=field, number=number, type=kind)
        pool.Add(fd)
    return (
        GetMessageClass(pool.FindMessageTypeByName("offtake.bench.BenchOrder")),
        GetMessageClass(pool.FindMessageTypeByName("offtake.bench.BenchOrderOut")),
    )


def __getattr__(name: str) -> Any:
    # The classes are made on first use: environments without protobuf import this module too.
    if name in ("BenchOrder", "BenchOrderOut"):
        order, out = _protobuf_classes()
        globals().update(BenchOrder=order, BenchOrderOut=out)
        return globals()[name]
    raise AttributeError(name)
