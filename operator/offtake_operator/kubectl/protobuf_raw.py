"""Protobuf values as raw fields, for ``kubectl offtake dlq`` on the admin's machine.

Decoding a Protobuf value with its message class means importing the module
``source.protobufMessage`` names, and that name is the tenant's: ``this:Anything`` ran the
``this`` module's code (the Zen of Python) in the admin's interpreter. So the plugin never
imports it unless the admin says ``--import``; without it, a value is read from the wire format
alone: the schema registry framing (magic byte, schema id, message indexes), then each field
as its number, wire type and value (varint, 64-bit, 32-bit as unsigned integers; a
length-delimited field as UTF-8 text when it is, else base64; nested messages are not guessed
at). Linear in the value's bytes: every length and varint is checked against the bytes left.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from offtake.contract import DecodeError, Decoder

MAGIC_BYTE = 0
HEADER_SIZE = 5
MAX_VARINT_BYTES = 10
WIRE_TYPES = {0: "varint", 1: "i64", 2: "len", 3: "group-start", 4: "group-end", 5: "i32"}
NOTE = (
    "raw Protobuf fields (field number, wire type, value): the plugin does not import "
    "source.protobufMessage; pass --import to decode with it"
)


def _varint(raw: bytes, at: int) -> tuple[int, int]:
    """The unsigned varint at ``at`` and the offset after it."""
    value = 0
    for i in range(MAX_VARINT_BYTES):
        if at + i >= len(raw):
            raise DecodeError(f"a varint at byte {at} runs past the value's {len(raw)} bytes")
        byte = raw[at + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, at + i + 1
    raise DecodeError(f"a varint at byte {at} is longer than {MAX_VARINT_BYTES} bytes")


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _fixed(raw: bytes, at: int, size: int) -> tuple[int, int]:
    if at + size > len(raw):
        raise DecodeError(f"a {size * 8}-bit field at byte {at} runs past the value's end")
    return int.from_bytes(raw[at : at + size], "little"), at + size


def fields(raw: bytes, at: int = 0) -> list[dict[str, Any]]:
    """Every field of an encoded message from ``at`` on, in the order written."""
    out: list[dict[str, Any]] = []
    while at < len(raw):
        key, at = _varint(raw, at)
        number, wire = key >> 3, key & 7
        if number == 0 or wire not in WIRE_TYPES:
            raise DecodeError(f"not a Protobuf field key at byte {at}: field {number} wire {wire}")
        field: dict[str, Any] = {"field": number, "wire": WIRE_TYPES[wire]}
        if wire == 0:
            field["value"], at = _varint(raw, at)
        elif wire == 1:
            field["value"], at = _fixed(raw, at, 8)
        elif wire == 5:
            field["value"], at = _fixed(raw, at, 4)
        elif wire == 2:
            size, at = _varint(raw, at)
            if at + size > len(raw):
                raise DecodeError(
                    f"field {number} claims {size} bytes at byte {at}; {len(raw) - at} are left"
                )
            chunk = raw[at : at + size]
            at += size
            try:
                field["text"] = chunk.decode("utf-8")
            except UnicodeDecodeError:
                field["base64"] = base64.b64encode(chunk).decode()
        out.append(field)
    return out


def read(raw: bytes) -> dict[str, Any]:
    """A schema registry wire-format Protobuf value as raw fields."""
    if len(raw) < HEADER_SIZE or raw[0] != MAGIC_BYTE:
        raise DecodeError(
            f"value is not in the schema registry wire format (magic byte 0 and a 4-byte schema "
            f"id): {len(raw)} byte(s)"
        )
    schema_id = int.from_bytes(raw[1:HEADER_SIZE], "big")
    count, at = _varint(raw, HEADER_SIZE)
    count = _zigzag(count)
    if count < 0 or count > len(raw) - at:
        raise DecodeError(f"a message index count of {count} with {len(raw) - at} bytes left")
    indexes = []
    for _ in range(count):
        index, at = _varint(raw, at)
        indexes.append(_zigzag(index))
    return {
        "schemaId": schema_id,
        "messageIndexes": indexes or [0],
        "fields": fields(raw, at),
        "note": NOTE,
    }


class RawProtobufDecoder(Decoder):
    """``source.format: protobuf`` without the message class: :func:`read` per value."""

    format = "protobuf"

    def value(self, raw: bytes, topic: str) -> Any:
        return read(raw)

    def fast(self, topic: str) -> tuple[Callable[[bytes], Any], tuple[type[Exception], ...]]:
        return read, (DecodeError,)
