"""JSON Schema in the wire format: orjson and the writer schema's validator, compiled once per
schema id (as confluent-kafka's JSONDeserializer validates, against the writer's schema, with
no format checks); the sink validates against its schema and writes with orjson."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from confluent_kafka.schema_registry import Schema
from confluent_kafka.serialization import SerializationContext
from jsonschema import ValidationError
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from referencing import Registry

from offtake.formats.base import Encoder
from offtake.formats.wire import HEADER_SIZE, Reader, SchemaDecoder, header


class SchemaMismatch(ValueError):
    """A value does not validate against its schema (the validator's first complaint)."""


def compiled(schema_str: str) -> Validator:
    schema = orjson.loads(schema_str)
    cls = validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, registry=Registry())


def _check(validator: Validator, value: Any) -> None:
    try:
        validator.validate(value)
    except ValidationError as exc:
        raise SchemaMismatch(exc.message) from None


class JsonSchemaDecoder(SchemaDecoder):
    format = "jsonschema"

    def reader(self, schema: Schema) -> Reader:
        validator = compiled(schema.schema_str or "")

        def read(raw: bytes, topic: str) -> Any:
            value = orjson.loads(memoryview(raw)[HEADER_SIZE:])
            _check(validator, value)
            return value

        return read

    def serde(self) -> Callable[[bytes, SerializationContext], Any]:
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer

        return JSONDeserializer(None, schema_registry_client=self._client)  # type: ignore[no-any-return]


class JsonSchemaEncoder(Encoder):
    format = "jsonschema"

    def __init__(self, schema_str: str, schema_id: int) -> None:
        self._validator = compiled(schema_str)
        self._header = header(schema_id)

    def encode(self, value: Any) -> bytes | None:
        if value is None:
            return None
        _check(self._validator, value)
        return self._header + orjson.dumps(value)
