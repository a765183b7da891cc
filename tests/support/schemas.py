"""Schema'd test records: confluent-kafka's own serializers against the test bed's registry."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from support.orders_pb import Order

ORDER_AVRO = {
    "type": "record",
    "name": "Order",
    "namespace": "offtake.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "item", "type": "string"},
        {"name": "amount", "type": "double"},
    ],
}
# Version 2: a new optional field, a compatible change.
ORDER_AVRO_V2 = {
    **ORDER_AVRO,
    "fields": [
        *ORDER_AVRO["fields"],
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
ORDER_JSON_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "item": {"type": "string"},
        "amount": {"type": "number"},
    },
    "required": ["id", "item", "amount"],
}
FORMATS = ("avro", "protobuf", "jsonschema")
PROTOBUF_MESSAGE = "support.orders_pb:Order"


def order(i: int) -> dict[str, Any]:
    return {"id": i, "item": f"item-{i}", "amount": i * 1.5}


def serializer(
    fmt: str, url: str, topic: str, avro_schema: dict[str, Any] = ORDER_AVRO
) -> Callable[[dict[str, Any]], bytes]:
    """Encodes an order dict as ``fmt`` in the wire format (registering the schema on first
    use, as a producer does)."""
    client = SchemaRegistryClient({"url": url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    if fmt == "avro":
        avro = AvroSerializer(client, json.dumps(avro_schema))
        return lambda value: bytes(avro(value, ctx))
    if fmt == "jsonschema":
        js = JSONSerializer(json.dumps(ORDER_JSON_SCHEMA), client)
        return lambda value: bytes(js(value, ctx))
    pb = ProtobufSerializer(Order, client, {"use.deprecated.format": False})
    return lambda value: bytes(pb(Order(**value), ctx))
