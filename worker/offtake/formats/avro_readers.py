"""The closures that read Avro values, for :mod:`offtake.formats.avro_fast`, which builds
them once per schema (see its docstring for the rule they keep: **a closure either gives exactly
what fastavro gives, or raises**, and then fastavro reads the value).

One bound is theirs, because fastavro has none (docs/security.md, "Second round"): **a value
cannot claim more than it carries**. An array of zero-width items (null, a record of no
fields, a fixed of size 0, or records of those) costs no byte per item, so fastavro appends for
as long as the count says (2**40 from 13 bytes). The closures read such arrays themselves
(:func:`reader_zero_width_array`) and let one value hold at most
:data:`ZERO_WIDTH_ITEMS_PER_BYTE` such items per byte of its bytes in all (at least
:data:`ZERO_WIDTH_ITEMS_FLOOR`): past that they raise
:class:`~offtake.formats.errors.OutOfBounds` (the record's decode error, never fastavro's), as
they do for a varint past 64 bits in such a value (fastavro would count its low 64 bits).
Every other item takes at least one byte: a count past the bytes ends at the value's end.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from typing import Any

from offtake.formats.errors import NotFast, OutOfBounds

Read = Callable[[bytes, int], tuple[Any, int]]  # (value bytes, position) -> (value, next position)

_unpack_f = struct.Struct("<f").unpack_from
_unpack_d = struct.Struct("<d").unpack_from

# Zero-width items one value may hold in all: as many per byte as a value of one-byte items
# could hold (so a decoded value's size stays in proportion to its bytes, as any other's does),
# and a floor so that a small legitimate value (an array of 1,000 nulls is 3 bytes) reads.
ZERO_WIDTH_ITEMS_PER_BYTE = 1
ZERO_WIDTH_ITEMS_FLOOR = 4096


class _Overlong(NotFast):  # a varint past 64 bits (see reader_budgeted)
    pass


def _read_long(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    pos += 1
    n = b & 0x7F
    shift = 7
    while b & 0x80:
        if shift > 63:  # longer than any 64-bit varint: fastavro's overflow, not ours
            raise _Overlong
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        shift += 7
    if n >> 64:  # fastavro keeps the low 64 bits only
        raise _Overlong
    return (n >> 1) ^ -(n & 1), pos


def _read_null(buf: bytes, pos: int) -> tuple[Any, int]:
    return None, pos


def _read_boolean(buf: bytes, pos: int) -> tuple[Any, int]:
    return buf[pos] != 0, pos + 1  # fastavro: any byte but 0 is true


def _read_float(buf: bytes, pos: int) -> tuple[Any, int]:
    return _unpack_f(buf, pos)[0], pos + 4


def _read_double(buf: bytes, pos: int) -> tuple[Any, int]:
    return _unpack_d(buf, pos)[0], pos + 8


def _read_bytes(buf: bytes, pos: int) -> tuple[Any, int]:
    n, pos = _read_long(buf, pos)
    end = pos + n
    if n < 0 or end > len(buf):  # fastavro reads what is there (or all of it, for n < 0)
        raise NotFast
    return buf[pos:end], end


def _read_string(buf: bytes, pos: int) -> tuple[Any, int]:
    n = buf[pos]
    if n < 0x80:  # one-byte length: most strings, read without a call
        n = (n >> 1) ^ -(n & 1)
        pos += 1
    else:
        n, pos = _read_long(buf, pos)
    end = pos + n
    if n < 0 or end > len(buf):
        raise NotFast
    return buf[pos:end].decode(), end


def reader_fixed(size: int) -> Read:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        end = pos + size
        if end > len(buf):
            raise NotFast
        return buf[pos:end], end

    return read


def reader_enum(symbols: tuple[str, ...]) -> Read:
    count = len(symbols)

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        i, pos = _read_long(buf, pos)
        if not 0 <= i < count:  # fastavro indexes a list: -1 would be the last symbol
            raise NotFast
        return symbols[i], pos

    return read


def reader_union(branches: tuple[Read, ...]) -> Read:
    count = len(branches)

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        i, pos = _read_long(buf, pos)
        if not 0 <= i < count:
            raise NotFast
        return branches[i](buf, pos)

    return read


def reader_array(item: Read) -> Read:
    # Every item takes at least one byte (zero-width items: reader_zero_width_array), so a
    # hostile count ends at the value's end, not after 2**63 appends.
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        out: list[Any] = []
        append = out.append
        count, pos = _read_long(buf, pos)
        while count:
            if count < 0:  # a block with its size in bytes, which the items say again
                count = -count
                pos = _read_long(buf, pos)[1]
            for _ in range(count):
                value, pos = item(buf, pos)
                append(value)
            count, pos = _read_long(buf, pos)
        return out, pos

    return read


class Budget(threading.local):
    """Zero-width items the value being read may still hold (per thread: a reader is shared)."""

    left = 0


def reader_zero_width_array(item: Read, budget: Budget) -> Read:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        out: list[Any] = []
        append = out.append
        count, pos = _read_long(buf, pos)
        while count:
            if count < 0:
                count = -count
                pos = _read_long(buf, pos)[1]
            budget.left -= count
            if budget.left < 0:
                raise OutOfBounds(
                    f"an array of zero-width items claims {count} items, past the "
                    f"{_zero_width_budget(len(buf))} such items a value of {len(buf)} bytes "
                    "may hold"
                )
            for _ in range(count):
                value, pos = item(buf, pos)
                append(value)
            count, pos = _read_long(buf, pos)
        return out, pos

    return read


def _zero_width_budget(size: int) -> int:
    return max(size * ZERO_WIDTH_ITEMS_PER_BYTE, ZERO_WIDTH_ITEMS_FLOOR)


def reader_budgeted(read: Read, budget: Budget) -> Read:
    """``read``, with the value's budget of zero-width items set first and a varint past 64
    bits refused (fastavro loops in C through an array count's low 64 bits: the fuzz found it)."""

    def budgeted(buf: bytes, pos: int) -> tuple[Any, int]:
        budget.left = _zero_width_budget(len(buf))
        try:
            return read(buf, pos)
        except _Overlong:
            raise OutOfBounds("a varint past 64 bits in a value with zero-width items") from None

    return budgeted


def reader_map(value_read: Read) -> Read:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        out: dict[str, Any] = {}
        count, pos = _read_long(buf, pos)
        while count:
            if count < 0:
                count = -count
                pos = _read_long(buf, pos)[1]
            for _ in range(count):
                key, pos = _read_string(buf, pos)
                out[key], pos = value_read(buf, pos)
            count, pos = _read_long(buf, pos)
        return out, pos

    return read


def reader_record(fields: tuple[tuple[str, Read], ...]) -> Read:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        out: dict[str, Any] = {}
        for name, read_field in fields:
            out[name], pos = read_field(buf, pos)
        return out, pos

    return read


def reader_logical(base: Read, convert: Callable[..., Any], schema: dict[str, Any]) -> Read:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        value, pos = base(buf, pos)
        return convert(value, schema, None), pos

    return read


PRIMITIVE_READERS: dict[str, Read] = {
    "null": _read_null,
    "boolean": _read_boolean,
    "int": _read_long,
    "long": _read_long,
    "float": _read_float,
    "double": _read_double,
    "bytes": _read_bytes,
    "string": _read_string,
}
