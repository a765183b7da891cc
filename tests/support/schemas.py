"""Schema'd test records: confluent-kafka's own serializers against the test bed's registry."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from support.orders_pb import Order, RichOrder
from support.record_schemas import ORDER, json_schema

ORDER_AVRO = ORDER.avro()
# Version 2: a new optional field, a compatible change.
ORDER_AVRO_V2 = {
    **ORDER_AVRO,
    "fields": [
        *ORDER_AVRO["fields"],
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
ORDER_JSON_SCHEMA = ORDER.json_schema()
FORMATS = ("avro", "protobuf", "jsonschema")
PROTOBUF_MESSAGE = "support.orders_pb:Order"


def order(i: int) -> dict[str, Any]:
    return {"id": i, "item": f"item-{i}", "amount": i * 1.5}


def serializer(
    fmt: str,
    url: str,
    topic: str,
    avro_schema: dict[str, Any] = ORDER_AVRO,
    client_conf: dict[str, str] | None = None,
) -> Callable[[dict[str, Any]], bytes]:
    """Encodes an order dict as ``fmt`` in the wire format (registering the schema on first
    use, as a producer does). ``client_conf``: the registry client's (TLS, credentials)."""
    client = SchemaRegistryClient(client_conf or {"url": url})
    return _wire_format(
        fmt, client, topic, avro_schema, ORDER_JSON_SCHEMA, Order, lambda value: Order(**value)
    )


def _wire_format(
    fmt: str,
    client: SchemaRegistryClient,
    topic: str,
    avro_schema: dict[str, Any],
    jsonschema: dict[str, Any],
    message_class: Any,
    message: Callable[[dict[str, Any]], Any],
) -> Callable[[dict[str, Any]], bytes]:
    """confluent-kafka's serializer of ``fmt`` for ``topic``'s values: Avro with
    ``avro_schema``, JSON Schema with ``jsonschema``, Protobuf as ``message(value)``, an
    instance of ``message_class``."""
    ctx = SerializationContext(topic, MessageField.VALUE)
    if fmt == "avro":
        avro = AvroSerializer(client, json.dumps(avro_schema))
        return lambda value: bytes(avro(value, ctx))
    if fmt == "jsonschema":
        js = JSONSerializer(json.dumps(jsonschema), client)
        return lambda value: bytes(js(value, ctx))
    pb = ProtobufSerializer(message_class, client, {"use.deprecated.format": False})
    return lambda value: bytes(pb(message(value), ctx))


# One field of each kind the Spark sink maps to a column type (tests/spark/test_schema_columns*).
RICH_AVRO: dict[str, Any] = {
    "type": "record",
    "name": "RichOrder",
    "namespace": "offtake.test",
    "fields": [
        {"name": "id", "type": "long"},
        {
            "name": "customer",
            "type": {
                "type": "record",
                "name": "Customer",
                "fields": [
                    {"name": "name", "type": "string"},
                    {
                        "name": "tier",
                        "type": {"type": "enum", "name": "Tier", "symbols": ["BASIC", "GOLD"]},
                    },
                ],
            },
        },
        {
            "name": "lines",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Line",
                    "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}],
                },
            },
        },
        {"name": "attrs", "type": {"type": "map", "values": "string"}},
        {
            "name": "total",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
        },
        {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
RICH_JSON_SCHEMA = json_schema(
    "RichOrder",
    {
        "id": {"type": "integer"},
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "tier": {"type": "string", "enum": ["BASIC", "GOLD"]},
            },
        },
        "lines": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
            },
        },
        "attrs": {"type": "object", "additionalProperties": {"type": "string"}},
        "total": {"type": "number"},
        "placed": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"},
        "note": {"type": ["null", "string"]},
    },
    ["id", "customer", "lines", "attrs", "total", "placed", "day"],
)
RICH_PROTOBUF_MESSAGE = "support.orders_pb:RichOrder"
PLACED = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def rich_order(fmt: str, i: int) -> dict[str, Any]:
    """Record ``i`` as ``fmt``'s serializer takes it."""
    placed = PLACED + dt.timedelta(seconds=i)
    value: dict[str, Any] = {
        "id": i,
        "customer": {"name": f"c{i % 3}", "tier": "GOLD" if i % 2 else "BASIC"},
        "lines": [{"sku": f"s{i}", "qty": i % 5}],
        "attrs": {"channel": "web"},
    }
    if fmt == "avro":
        return {
            **value,
            "total": Decimal(f"{i}.25"),
            "placed": placed,
            "day": placed.date(),
            "note": None if i % 2 else f"n{i}",
        }
    if fmt == "jsonschema":
        return {
            **value,
            "total": i + 0.25,
            "placed": placed.isoformat(),
            "day": placed.date().isoformat(),
            "note": None if i % 2 else f"n{i}",
        }
    return {**value, "total": i + 0.25, "placed": placed, "blob": bytes([i % 256, 1])}


def rich_serializer(fmt: str, url: str, topic: str) -> Callable[[dict[str, Any]], bytes]:
    """Encodes a :func:`rich_order` value as ``fmt`` in the wire format."""

    def message(value: dict[str, Any]) -> Any:
        rich = RichOrder(**{k: v for k, v in value.items() if k != "placed"})
        rich.placed.FromDatetime(value["placed"])
        return rich

    client = SchemaRegistryClient({"url": url})
    return _wire_format(fmt, client, topic, RICH_AVRO, RICH_JSON_SCHEMA, RichOrder, message)
