"""Values with a schema (avro | protobuf | jsonschema) in the Confluent wire format.

A value is a magic byte 0, the writer's schema id (4 bytes, big-endian) and the encoded data.
confluent-kafka's own deserializers decode it with the writer's schema, which the registry
client fetches once per schema id and then caches. What can go wrong is told apart, because the
error policy must treat it differently:

- the bytes are not in the wire format, the schema id is unknown to the registry, or the data
  does not match its schema: the record's fault -> :class:`SchemaDecodeError` (a
  :class:`DecodeError`: the error policy, with headers naming the schema id and the reason);
- the registry cannot be reached or answers 5xx/429: not the record's fault ->
  :class:`RegistryUnavailable`, which the caller retries with backoff (never a dead letter).
"""

from __future__ import annotations

import inspect
import struct
from collections.abc import Callable
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext

from offtake.processing.decode import DecodeError
from offtake.schema_registry import is_outage, load_message_class

MAGIC_BYTE = 0
_HEADER = struct.Struct(">bI")

# Dead-letter headers (docs/worker.md, "Formats"): which schema id, and why in one word; the
# dead-letter queue (offtake.engine.dead_letters) knows them by the same names.
H_SCHEMA_ID = "offtake.schema.id"
H_REASON = "offtake.error.reason"
NOT_WIRE_FORMAT = "not-wire-format"
UNKNOWN_SCHEMA = "unknown-schema-id"
SCHEMA_MISMATCH = "schema-mismatch"


class SchemaDecodeError(DecodeError):
    """The record's value cannot be decoded with a registered schema; names id and reason."""

    def __init__(self, message: str, schema_id: int | None, reason: str) -> None:
        super().__init__(message)
        self.schema_id = schema_id
        self.reason = reason

    @property
    def headers(self) -> dict[str, str]:
        """Extra dead-letter headers."""
        return {
            H_SCHEMA_ID: "" if self.schema_id is None else str(self.schema_id),
            H_REASON: self.reason,
        }


class RegistryUnavailable(Exception):
    """The schema registry did not answer (or answered 5xx/429): retry later, not the record's
    fault."""


def wire_schema_id(raw: bytes) -> int:
    """The schema id of a wire-format value; SchemaDecodeError if it is not one."""
    if len(raw) < _HEADER.size or raw[0] != MAGIC_BYTE:
        first = f"0x{raw[0]:02x}" if raw else "nothing"
        raise SchemaDecodeError(
            f"value is not in the schema registry wire format (magic byte 0 and a 4-byte schema "
            f"id): {len(raw)} byte(s), first byte {first}",
            None,
            NOT_WIRE_FORMAT,
        )
    return int(_HEADER.unpack_from(raw)[1])


class SchemaValueDecoder:
    """Decodes one format's wire-format values to Python values (dicts, lists, scalars)."""

    def __init__(
        self, fmt: str, client: SchemaRegistryClient, protobuf_message: Any = None
    ) -> None:
        """``protobuf_message``: the generated class, or its ``module:Class`` path."""
        self.fmt = fmt
        self._client = client
        self._known: set[int] = set()  # schema ids whose writer schema the client has cached
        self._deserialize = _deserializer(fmt, client, protobuf_message)

    def decode(self, raw: bytes, topic: str) -> Any:
        schema_id = wire_schema_id(raw)
        if schema_id not in self._known:
            self._fetch(schema_id)
        try:
            return self._deserialize(raw, SerializationContext(topic, MessageField.VALUE))
        except Exception as exc:
            if is_outage(exc):  # a lookup the deserializer made itself (a reader schema)
                raise RegistryUnavailable(f"schema registry: {exc}") from exc
            raise SchemaDecodeError(
                f"value does not decode as {self.fmt} with schema id {schema_id}: "
                f"{type(exc).__name__}: {exc}",
                schema_id,
                SCHEMA_MISMATCH,
            ) from None

    def _fetch(self, schema_id: int) -> None:
        # The deserializer asks the client for the same id; the client caches the answer, so
        # this is the one registry round trip per writer schema.
        try:
            if self.fmt == "protobuf":
                self._client.get_schema(schema_id, fmt="serialized")
            else:
                self._client.get_schema(schema_id)
        except Exception as exc:
            if is_outage(exc):
                raise RegistryUnavailable(f"schema registry: {exc}") from exc
            raise SchemaDecodeError(
                f"schema id {schema_id} is not known to the schema registry: {exc}",
                schema_id,
                UNKNOWN_SCHEMA,
            ) from None
        self._known.add(schema_id)


def _deserializer(
    fmt: str, client: SchemaRegistryClient, protobuf_message: Any
) -> Callable[[bytes, SerializationContext], Any]:
    if fmt == "avro":
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        return AvroDeserializer(client)  # type: ignore[no-any-return]
    if fmt == "jsonschema":
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer

        return JSONDeserializer(None, schema_registry_client=client)  # type: ignore[no-any-return]
    if fmt == "protobuf":
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
        from google.protobuf.json_format import MessageToDict

        assert protobuf_message is not None, "the loader requires source.protobufMessage"
        cls = (
            load_message_class(protobuf_message)
            if isinstance(protobuf_message, str)
            else protobuf_message
        )
        deserializer = ProtobufDeserializer(cls, {}, client)

        # Fields at their default (0, "") are values too; int64 as numbers where the protobuf
        # runtime can (6.31+), not the JSON mapping's strings.
        options: dict[str, Any] = {
            "preserving_proto_field_name": True,
            "always_print_fields_with_no_presence": True,
        }
        if "unquote_int64_if_possible" in inspect.signature(MessageToDict).parameters:
            options["unquote_int64_if_possible"] = True

        def decode(raw: bytes, ctx: SerializationContext) -> Any:
            return MessageToDict(deserializer(raw, ctx), **options)

        return decode
    raise ValueError(f"not a schema format: {fmt}")
