"""Avro in the wire format, with the parsed schema cached per schema id: what confluent-kafka's
AvroDeserializer and AvroSerializer do per value, without their per-call lookups (subject
name, rules, caches behind locks), which made them about 5x slower per record (issue 24).

Values are read and written by closures built once per schema (:mod:`offtake.formats.avro_fast`);
fastavro's schemaless reader and writer take whatever those hand back, and their answer is
the answer."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import orjson
from confluent_kafka.schema_registry import Schema
from confluent_kafka.serialization import SerializationContext
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from offtake.formats.avro_fast import build_reader, build_writer
from offtake.formats.base import Encoder
from offtake.formats.errors import OutOfBounds
from offtake.formats.wire import HEADER_SIZE, Reader, SchemaDecoder, header


def parsed(schema_str: str) -> Any:
    """The parsed schema, as confluent-kafka parses it (a bare primitive name is allowed)."""
    text = schema_str.strip()
    if text[:1] not in ("{", "["):
        text = '{"type":' + text + "}"
    return parse_schema(orjson.loads(text))


def _is_bytes(schema: Any) -> bool:
    # confluent-kafka writes a plain ``bytes`` schema's value as it is, not Avro-encoded.
    return schema == "bytes" or (isinstance(schema, dict) and schema.get("type") == "bytes")


# confluent-kafka's deserializer refuses a value with no payload byte (even one its serializer
# wrote, an empty ``bytes``): read alike.
_NO_PAYLOAD = f"no payload after the {HEADER_SIZE}-byte header"


def _payload(raw: bytes) -> bytes:
    if len(raw) <= HEADER_SIZE:
        raise ValueError(_NO_PAYLOAD)
    return raw[HEADER_SIZE:]


class AvroDecoder(SchemaDecoder):
    format = "avro"

    def reader(self, schema: Schema) -> Reader:
        writer = parsed(schema.schema_str or "")
        if _is_bytes(writer):
            return lambda raw, topic: _payload(raw)

        fast = build_reader(writer)

        def read(raw: bytes, topic: str) -> Any:
            if len(raw) <= HEADER_SIZE:
                raise ValueError(_NO_PAYLOAD)
            if fast is not None:
                try:
                    return fast(raw, HEADER_SIZE)[0]
                except OutOfBounds:  # a claim past the bounds: never fastavro's to try
                    raise
                except IndexError:
                    # The value ended before its schema did. fastavro reads past the end of
                    # its buffer as zeros without an error, so a count claimed before the end
                    # loops in C for as long as the claim (the decoder fuzz found one: minutes).
                    raise OutOfBounds(
                        f"the value ends at byte {len(raw)} before its schema's fields do"
                    ) from None
                except Exception:  # odd bytes: fastavro's reading (or its error) is the answer
                    pass
            value = io.BytesIO(raw)  # shares raw's buffer: reading past the header copies nothing
            value.seek(HEADER_SIZE)
            return schemaless_reader(value, writer, None)

        return read

    def serde(self) -> Callable[[bytes, SerializationContext], Any]:
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        return AvroDeserializer(self._client)  # type: ignore[no-any-return]


class AvroEncoder(Encoder):
    """Values as Avro with the one schema the sink resolved at start (schema id fixed)."""

    format = "avro"

    def __init__(self, schema_str: str, schema_id: int) -> None:
        self._schema = parsed(schema_str)
        self._header = header(schema_id)
        self._bytes = _is_bytes(self._schema)
        self._fast = None if self._bytes else build_writer(self._schema)

    def encode(self, value: Any) -> bytes | None:
        if value is None:
            return None
        if self._bytes:
            return self._header + (value if isinstance(value, bytes) else str(value).encode())
        if self._fast is not None:
            buf = bytearray(self._header)
            try:
                self._fast(value, buf)
                return bytes(buf)
            except Exception:  # an odd value: fastavro's bytes (or its refusal) are the answer
                pass
        out = io.BytesIO()
        out.write(self._header)
        schemaless_writer(out, self._schema, value)
        return out.getvalue()
