"""JSON Schema in the wire format: orjson and the writer schema's validator, compiled once per
schema id (as confluent-kafka's JSONDeserializer validates, against the writer's schema, with
no format checks); the sink validates against its schema and writes with orjson. Patterns are
matched in RE2, in linear time (:mod:`offtake.formats.patterns`), on both paths."""

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

from offtake.errors import OfftakeError
from offtake.formats import patterns
from offtake.formats.base import Encoder
from offtake.formats.wire import HEADER_SIZE, Reader, SchemaDecoder, header


class SchemaMismatch(OfftakeError, ValueError):
    """A value does not validate against its schema (the validator's first complaint)."""


def compiled(schema_str: str) -> Validator:
    return linear_validator(orjson.loads(schema_str), Registry())


def linear_validator(schema: Any, registry: Registry) -> Validator:
    """The validator of a parsed schema, its patterns in RE2: the schema checked against its
    metaschema, then its patterns (UnsafePattern, naming the pattern)."""
    cls = validator_for(schema)
    cls.check_schema(schema)
    patterns.check(schema)
    return patterns.linear(cls)(schema, registry=registry)


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

        class Linear(JSONDeserializer):
            # confluent-kafka validates with jsonschema's own classes, whose patterns run in
            # Python's re: the same validator as the fast path's, with references resolved.
            def _get_validator(self, schema: Schema, parsed: Any, registry: Registry) -> Any:
                with self._validators_lock:
                    found = self._validators.get(schema, None)
                if found is None:
                    for uri in registry:  # the referenced schemas, resolved
                        patterns.check(registry.contents(uri))
                    found = linear_validator(parsed, registry)
                    with self._validators_lock:
                        self._validators[schema] = found
                return found

        deserialize: Callable[[bytes, SerializationContext], Any]
        deserialize = Linear(None, schema_registry_client=self._client)
        return deserialize


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
