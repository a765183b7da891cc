"""The closures that write Avro values, for :mod:`offtake.formats.avro_fast`, which builds
them once per schema (see its docstring for the rule they keep: **a closure either writes
exactly the bytes fastavro writes, or raises**, and then fastavro writes the value).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from offtake.formats.errors import NotFast

Write = Callable[[Any, bytearray], None]  # appends the value's encoding, or raises

_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_pack_f = struct.Struct("<f").pack
_pack_d = struct.Struct("<d").pack


def write_varint(n: int, out: bytearray) -> None:
    n = (n << 1) ^ (n >> 63)
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _write_null(value: Any, out: bytearray) -> None:
    if value is not None:
        raise NotFast


def _write_boolean(value: Any, out: bytearray) -> None:
    if type(value) is not bool:
        raise NotFast
    out.append(value)


def _write_int(value: Any, out: bytearray) -> None:
    # The int32 range too: fastavro writes a wider int as it is, but refuses it in a union.
    if type(value) is not int or not _INT_MIN <= value <= _INT_MAX:
        raise NotFast
    write_varint(value, out)


def _write_long(value: Any, out: bytearray) -> None:
    if type(value) is not int or not _LONG_MIN <= value <= _LONG_MAX:
        raise NotFast
    if 0 <= value < 64:  # one byte: most counts, flags and small ids
        out.append(value << 1)
    else:
        write_varint(value, out)


def _write_float(value: Any, out: bytearray) -> None:
    # NaN's bits and float32 overflow (struct raises, fastavro writes inf) are fastavro's.
    if type(value) is not float or value != value:
        raise NotFast
    out += _pack_f(value)


def _write_double(value: Any, out: bytearray) -> None:
    if type(value) is not float:
        raise NotFast
    out += _pack_d(value)


def _write_bytes(value: Any, out: bytearray) -> None:
    if type(value) is not bytes and type(value) is not bytearray:  # a decimal's is a bytearray
        raise NotFast
    write_varint(len(value), out)
    out += value


def _write_string(value: Any, out: bytearray) -> None:
    if type(value) is not str:
        raise NotFast
    data = value.encode()
    n = len(data)
    if n < 64:
        out.append(n << 1)
    else:
        write_varint(n, out)
    out += data


def writer_fixed(size: int) -> Write:
    def write(value: Any, out: bytearray) -> None:
        if (type(value) is not bytes and type(value) is not bytearray) or len(value) != size:
            raise NotFast
        out += value

    return write


def writer_enum(symbols: tuple[str, ...]) -> Write:
    index = {symbol: i for i, symbol in enumerate(symbols)}

    def write(value: Any, out: bytearray) -> None:
        if type(value) is not str:
            raise NotFast
        write_varint(index[value], out)  # KeyError for a stranger: fastavro's to refuse

    return write


def writer_array(item: Write) -> Write:
    def write(value: Any, out: bytearray) -> None:
        if type(value) is not list:
            raise NotFast
        if value:
            write_varint(len(value), out)
            for element in value:
                item(element, out)
        out.append(0)

    return write


def writer_map(value_write: Write) -> Write:
    def write(value: Any, out: bytearray) -> None:
        if type(value) is not dict:
            raise NotFast
        if value:
            write_varint(len(value), out)
            for key, element in value.items():
                _write_string(key, out)
                value_write(element, out)
        out.append(0)

    return write


def writer_record(fields: tuple[tuple[str, Write], ...], validating: bool) -> Write:
    # A missing field (fastavro writes its default, or refuses) is fastavro's. Below a union,
    # fastavro first validates the value, and a "-type" key naming a type is part of that.
    def write(value: Any, out: bytearray) -> None:
        if type(value) is not dict or (validating and "-type" in value):
            raise NotFast
        for name, write_field in fields:
            write_field(value[name], out)

    return write


Branch = tuple[bytes, Write]  # a union branch's index, written, and its closure


def writer_by_type(branches: dict[type, Branch | None], other: Branch | None) -> Write:
    # The one branch that can take a value of its exact Python type (see avro_fast._VALIDATES;
    # None where two can); a type no plain branch takes goes to the one logical branch, if there
    # is one.
    def write(value: Any, out: bytearray) -> None:
        branch = branches.get(type(value), other)
        if branch is None:
            raise NotFast
        out += branch[0]
        branch[1](value, out)

    return write


def writer_logical(base: Write, prepare: Callable[..., Any], schema: dict[str, Any]) -> Write:
    def write(value: Any, out: bytearray) -> None:
        base(prepare(value, schema), out)

    return write


PRIMITIVE_WRITERS: dict[str, Write] = {
    "null": _write_null,
    "boolean": _write_boolean,
    "int": _write_int,
    "long": _write_long,
    "float": _write_float,
    "double": _write_double,
    "bytes": _write_bytes,
    "string": _write_string,
}
