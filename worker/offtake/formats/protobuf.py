"""Protobuf in the wire format: the message index (zigzag varints) skipped, the payload parsed
with the pipeline's message class (``protobufMessage``, as confluent-kafka's
ProtobufDeserializer does with the class it is given) and turned into a dict (by closures
built once per class where they can, :mod:`offtake.formats.protobuf_fast`).

Values are protobuf's JSON mapping with the field names as declared, fields at their default
(0, "") present, int64 as numbers where the protobuf runtime can (6.31+), not the mapping's
strings; the sink reads the same mapping back (``ParseDict``) and writes the message with the
header and message index its schema was registered with.
"""

from __future__ import annotations

import base64
import inspect
from collections.abc import Callable
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.serialization import SerializationContext
from google.protobuf.descriptor_pb2 import FileDescriptorProto
from google.protobuf.json_format import MessageToDict, ParseDict

from offtake.formats.base import Encoder
from offtake.formats.errors import OutOfBounds
from offtake.formats.protobuf_fast import build_from_dict, build_to_dict
from offtake.formats.wire import HEADER_SIZE, Reader, SchemaDecoder
from offtake.schema_registry import load_message_class

_TO_DICT: dict[str, Any] = {
    "preserving_proto_field_name": True,
    "always_print_fields_with_no_presence": True,
}
if "unquote_int64_if_possible" in inspect.signature(MessageToDict).parameters:
    _TO_DICT["unquote_int64_if_possible"] = True


def message_class(message: Any) -> Any:
    """The generated class, from itself or its ``module:Class`` path."""
    return load_message_class(message) if isinstance(message, str) else message


# A varint of the message index is at most 10 bytes (64 bits), as protobuf's own; confluent-kafka
# caps the count of indexes at 100,000 and so do we.
_VARINT_MAX_BYTES = 10
_INDEXES_MAX = 100_000


def payload_start(raw: bytes, max_depth: int = _INDEXES_MAX) -> int:
    """Where the message starts: after the header and the message index (a count, then that
    many indexes; a count of 0 is the first message of the file).

    Bounded, so a hostile index costs time in proportion to its bytes only: a varint past 10
    bytes, a count of indexes past the bytes left (each index takes one at least) or past
    ``max_depth`` (the writer schema's deepest nesting of messages: a longer path names no
    message of it) is :class:`OutOfBounds`; an index that ends early, a ValueError."""
    pos = HEADER_SIZE
    count, pos = _varint(raw, pos)
    count = (count >> 1) ^ -(count & 1)
    if count < 0:
        raise ValueError(f"invalid message index length {count}")
    if count > len(raw) - pos or count > max_depth:
        raise OutOfBounds(
            f"the message index claims {count} indexes, past the {len(raw) - pos} bytes left "
            f"or the {max_depth} a path to a message of the writer schema can have"
        )
    for _ in range(count):
        _, pos = _varint(raw, pos)
    return pos


def _varint(raw: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    end = min(len(raw), pos + _VARINT_MAX_BYTES)
    while pos < end:
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    if end < len(raw):
        raise OutOfBounds(f"a varint of the message index runs past {_VARINT_MAX_BYTES} bytes")
    raise ValueError("the message index ends early")


def nesting_depth(schema: Schema) -> int:
    """The deepest nesting of messages in a registered schema (``fmt="serialized"``: a
    FileDescriptorProto, base64), the longest message index a value of it can carry; the
    confluent-kafka cap if the schema does not parse as one (the payload's class reads it)."""
    try:
        proto = FileDescriptorProto.FromString(base64.b64decode(schema.schema_str or ""))
    except Exception:
        return _INDEXES_MAX
    depth, level = 0, list(proto.message_type)
    while level:  # level by level: a schema's text bounds the walk, recursion cannot
        depth += 1
        level = [nested for message in level for nested in message.nested_type]
    return max(depth, 1)


class ProtobufDecoder(SchemaDecoder):
    format = "protobuf"

    def __init__(self, client: SchemaRegistryClient, message: Any) -> None:
        super().__init__(client)
        assert message is not None, "the loader requires source.protobufMessage"
        self._cls = message_class(message)
        self._to_dict = build_to_dict(self._cls, _TO_DICT)

    def _fetch(self, schema_id: int) -> Schema:
        return self._client.get_schema(schema_id, fmt="serialized")

    def needs_serde(self, schema: Schema) -> bool:
        # The message class reads the payload whatever the writer schema imports (references
        # are only needed to parse the writer schema, which the fast path does not): rules only.
        return bool(schema.rule_set)

    def reader(self, schema: Schema) -> Reader:
        parse = self._cls.FromString
        to_dict = self._to_dict
        depth = nesting_depth(schema)

        def read(raw: bytes, topic: str) -> Any:
            message = parse(raw[payload_start(raw, depth) :])
            if to_dict is not None:
                try:
                    return to_dict(message)
                except Exception:  # an odd value: json_format's mapping (or error) is the answer
                    pass
            return MessageToDict(message, **_TO_DICT)

        return read

    def serde(self) -> Callable[[bytes, SerializationContext], Any]:
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

        deserialize = ProtobufDeserializer(self._cls, {}, self._client)

        def read(raw: bytes, ctx: SerializationContext) -> Any:
            # confluent-kafka reads the message index unbounded: ours first, which refuses
            # what would cost it more than the bytes.
            payload_start(raw)
            return MessageToDict(deserialize(raw, ctx), **_TO_DICT)

        return read


class ProtobufEncoder(Encoder):
    """Values (protobuf's JSON mapping) as the message class, after ``prefix``: the header and
    message index the sink's schema was resolved with."""

    format = "protobuf"

    def __init__(self, message: Any, prefix: bytes) -> None:
        self._cls = message_class(message)
        self._prefix = prefix
        self._fast = build_from_dict(self._cls)

    def encode(self, value: Any) -> bytes | None:
        if value is None:
            return None
        if self._fast is not None:
            try:
                return self._prefix + self._fast(value)
            except Exception:  # an odd value: json_format's bytes (or its refusal) are the answer
                pass
        data: bytes = ParseDict(value, self._cls()).SerializeToString()
        return self._prefix + data
