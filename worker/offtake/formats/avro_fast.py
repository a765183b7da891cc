"""Avro values read and written by closures built once per schema, for the hot path.

fastavro's ``schemaless_reader`` and ``schemaless_writer`` spend most of a small record's time
on per-call set-up and on dispatching every node by its type name: 1.9 and 2.6 µs for the
bench's four-field record, 1.3 and 1.6 µs here. The schema is walked once (its id first seen)
into nested closures; no code is generated, so nothing a registry serves is ever executed.

The rule that keeps this safe: **a closure either gives exactly what fastavro gives, or raises**,
and on any exception the caller asks fastavro, whose answer (value, bytes or error) is the
answer. So every quirk of fastavro on odd input (a negative length, an out-of-range union or
enum index, a varint past 64 bits, a string cut short at the end of the value, a value of a
neighbouring Python type) is fastavro's, not a second reading of it. ``build_reader`` and
``build_writer`` return None for a schema they do not take (a recursive type, to read);
fastavro then reads or writes every value of it. ``tests/contract/test_avro_fast.py`` holds
both to fastavro on a generated corpus and on mutated bytes.

Two bounds come before that rule, because fastavro has none (docs/security.md, "Second round"):

- **A schema is built in time linear in its text**: each named type's closures are built once
  and every reference to it shares them (memoised by full name, failures too), so d nested
  records each referring to the next twice cost d builds, not 2**d.
- **A value cannot claim more than it carries**: an array of zero-width items (null, a record
  of no fields, a fixed of size 0, or records of those) costs no byte per item, so fastavro
  appends for as long as the count says (2**40 from 13 bytes). The closures read such arrays
  themselves and let one value hold at most :data:`ZERO_WIDTH_ITEMS_PER_BYTE` such items per
  byte of its bytes in all (at least :data:`ZERO_WIDTH_ITEMS_FLOOR`): past that they raise
  :class:`~offtake.formats.errors.OutOfBounds` (the record's decode error, never fastavro's),
  as they do for a varint past 64 bits in such a value (fastavro would count its low 64 bits).
  Every other item takes at least one byte: a count past the bytes ends at the value's end.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from fastavro.read import LOGICAL_READERS
from fastavro.write import LOGICAL_WRITERS

from offtake.formats.errors import NotFast, OutOfBounds

Read = Callable[[bytes, int], tuple[Any, int]]  # (value bytes, position) -> (value, next position)
Write = Callable[[Any, bytearray], None]  # appends the value's encoding, or raises

_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_unpack_f = struct.Struct("<f").unpack_from
_unpack_d = struct.Struct("<d").unpack_from
_pack_f = struct.Struct("<f").pack
_pack_d = struct.Struct("<d").pack
_PRIMITIVES = frozenset(("null", "boolean", "int", "long", "float", "double", "bytes", "string"))
_KINDS = _PRIMITIVES | {"record", "enum", "fixed", "array", "map"}  # a type object's "type"
_NAMED = ("record", "enum", "fixed")

# Zero-width items one value may hold in all: as many per byte as a value of one-byte items
# could hold (so a decoded value's size stays in proportion to its bytes, as any other's does),
# and a floor so that a small legitimate value (an array of 1,000 nulls is 3 bytes) reads.
ZERO_WIDTH_ITEMS_PER_BYTE = 1
ZERO_WIDTH_ITEMS_FLOOR = 4096


# -- reading -----------------------------------------------------------------------------------


class _Overlong(NotFast):  # a varint past 64 bits (see _reader_budgeted)
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


def _reader_fixed(size: int) -> Read:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        end = pos + size
        if end > len(buf):
            raise NotFast
        return buf[pos:end], end

    return read


def _reader_enum(symbols: tuple[str, ...]) -> Read:
    count = len(symbols)

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        i, pos = _read_long(buf, pos)
        if not 0 <= i < count:  # fastavro indexes a list: -1 would be the last symbol
            raise NotFast
        return symbols[i], pos

    return read


def _reader_union(branches: tuple[Read, ...]) -> Read:
    count = len(branches)

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        i, pos = _read_long(buf, pos)
        if not 0 <= i < count:
            raise NotFast
        return branches[i](buf, pos)

    return read


def _reader_array(item: Read) -> Read:
    # Every item takes at least one byte (zero-width items: _reader_zero_width_array), so a
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


class _Budget(threading.local):
    """Zero-width items the value being read may still hold (per thread: a reader is shared)."""

    left = 0


def _reader_zero_width_array(item: Read, budget: _Budget) -> Read:
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


def _reader_budgeted(read: Read, budget: _Budget) -> Read:
    """``read``, with the value's budget of zero-width items set first and a varint past 64
    bits refused (fastavro loops in C through an array count's low 64 bits: the fuzz found it)."""

    def budgeted(buf: bytes, pos: int) -> tuple[Any, int]:
        budget.left = _zero_width_budget(len(buf))
        try:
            return read(buf, pos)
        except _Overlong:
            raise OutOfBounds("a varint past 64 bits in a value with zero-width items") from None

    return budgeted


def _reader_map(value_read: Read) -> Read:
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


def _reader_record(fields: tuple[tuple[str, Read], ...]) -> Read:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        out: dict[str, Any] = {}
        for name, read_field in fields:
            out[name], pos = read_field(buf, pos)
        return out, pos

    return read


def _reader_logical(base: Read, convert: Callable[..., Any], schema: dict[str, Any]) -> Read:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        value, pos = base(buf, pos)
        return convert(value, schema, None), pos

    return read


_PRIMITIVE_READERS: dict[str, Read] = {
    "null": _read_null,
    "boolean": _read_boolean,
    "int": _read_long,
    "long": _read_long,
    "float": _read_float,
    "double": _read_double,
    "bytes": _read_bytes,
    "string": _read_string,
}


# -- writing -----------------------------------------------------------------------------------


def _write_varint(n: int, out: bytearray) -> None:
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
    _write_varint(value, out)


def _write_long(value: Any, out: bytearray) -> None:
    if type(value) is not int or not _LONG_MIN <= value <= _LONG_MAX:
        raise NotFast
    if 0 <= value < 64:  # one byte: most counts, flags and small ids
        out.append(value << 1)
    else:
        _write_varint(value, out)


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
    _write_varint(len(value), out)
    out += value


def _write_string(value: Any, out: bytearray) -> None:
    if type(value) is not str:
        raise NotFast
    data = value.encode()
    n = len(data)
    if n < 64:
        out.append(n << 1)
    else:
        _write_varint(n, out)
    out += data


def _writer_fixed(size: int) -> Write:
    def write(value: Any, out: bytearray) -> None:
        if (type(value) is not bytes and type(value) is not bytearray) or len(value) != size:
            raise NotFast
        out += value

    return write


def _writer_enum(symbols: tuple[str, ...]) -> Write:
    index = {symbol: i for i, symbol in enumerate(symbols)}

    def write(value: Any, out: bytearray) -> None:
        if type(value) is not str:
            raise NotFast
        _write_varint(index[value], out)  # KeyError for a stranger: fastavro's to refuse

    return write


def _writer_array(item: Write) -> Write:
    def write(value: Any, out: bytearray) -> None:
        if type(value) is not list:
            raise NotFast
        if value:
            _write_varint(len(value), out)
            for element in value:
                item(element, out)
        out.append(0)

    return write


def _writer_map(value_write: Write) -> Write:
    def write(value: Any, out: bytearray) -> None:
        if type(value) is not dict:
            raise NotFast
        if value:
            _write_varint(len(value), out)
            for key, element in value.items():
                _write_string(key, out)
                value_write(element, out)
        out.append(0)

    return write


def _writer_record(fields: tuple[tuple[str, Write], ...], validating: bool) -> Write:
    # A missing field (fastavro writes its default, or refuses) is fastavro's. Below a union,
    # fastavro first validates the value, and a "-type" key naming a type is part of that.
    def write(value: Any, out: bytearray) -> None:
        if type(value) is not dict or (validating and "-type" in value):
            raise NotFast
        for name, write_field in fields:
            write_field(value[name], out)

    return write


Branch = tuple[bytes, Write]  # a union branch's index, written, and its closure


def _writer_by_type(branches: dict[type, Branch | None], other: Branch | None) -> Write:
    # The one branch that can take a value of its exact Python type (see _VALIDATES; None where
    # two can); a type no plain branch takes goes to the one logical branch, if there is one.
    def write(value: Any, out: bytearray) -> None:
        branch = branches.get(type(value), other)
        if branch is None:
            raise NotFast
        out += branch[0]
        branch[1](value, out)

    return write


def _writer_logical(base: Write, prepare: Callable[..., Any], schema: dict[str, Any]) -> Write:
    def write(value: Any, out: bytearray) -> None:
        base(prepare(value, schema), out)

    return write


# fastavro writes a union's value in the first branch its validation accepts (a record: the one
# sharing most fields; float: double if one follows). Which Python types each kind of branch
# accepts there (fastavro/_validation.pyx): a type that only one branch accepts picks that
# branch, as fastavro would; a value of a type two branches accept (an int in ["int", "long"],
# a str in [enum, "string"]), or of any other type (a tuple, a subclass), is fastavro's.
_VALIDATES: dict[str, tuple[type, ...]] = {
    "null": (type(None),),
    "boolean": (bool,),
    "int": (int,),
    "long": (int,),
    "float": (int, float),
    "double": (int, float),
    "string": (str,),
    "enum": (str,),
    "bytes": (bytes, bytearray),
    "fixed": (bytes, bytearray),
    "array": (list,),
    "map": (dict,),
    "record": (dict,),
}

_PRIMITIVE_WRITERS: dict[str, Write] = {
    "null": _write_null,
    "boolean": _write_boolean,
    "int": _write_int,
    "long": _write_long,
    "float": _write_float,
    "double": _write_double,
    "bytes": _write_bytes,
    "string": _write_string,
}


# -- building ----------------------------------------------------------------------------------


def _size(schema: dict[str, Any]) -> int:
    # fastavro parses any size (-1, "4", 4.5) and reads fo.read(size) with it: such a schema is
    # fastavro's, a negative size must not move a closure's position backwards.
    size = schema.get("size")
    if type(size) is not int or size < 0:
        raise NotFast
    return size


def _logical(
    table: dict[str, Callable[..., Any]], schema: Any, kind: str
) -> Callable[..., Any] | None:
    """fastavro's conversion of a logical type, from its LOGICAL_READERS or LOGICAL_WRITERS
    (None: a plain type, or a logical type fastavro does not know: read and written as its
    base type)."""
    logical = schema.get("logicalType") if isinstance(schema, dict) else None
    return table.get(f"{kind}-{logical}") if logical else None


def _takes_none(prepare: Callable[..., Any], schema: Any, kind: str) -> bool:
    # fastavro's logical writers all pass None through (and None validates no base type but
    # null); asked here, at build, rather than assumed.
    try:
        return kind == "null" or prepare(None, schema) is not None
    except Exception:
        return True


_Built = TypeVar("_Built")
_FAILED = object()  # a named type whose closures could not be built: fastavro's, every time


class _Builder:
    """One walk of a parsed schema (fastavro's ``parse_schema``: named types by full name).

    Each named type is built once per kind of closure and every later reference shares what
    was built, or the NotFast it raised: a reference is a dictionary lookup, so the walk is
    linear in the schema's text however often its types refer to each other."""

    def __init__(self, schema: Any) -> None:
        self._named: dict[str, Any] = {}
        if isinstance(schema, dict):
            self._named.update(schema.get("__named_schemas", {}))
        self._building: set[str] = set()
        self._built: dict[tuple[str, str], Any] = {}  # (closure kind, full name) -> closure
        self.budget = _Budget()  # shared by every zero-width array of this schema's readers
        self.zero_width_arrays = False

    def _resolve(self, schema: Any) -> tuple[Any, str]:
        """The schema with a named reference replaced by its definition, and its type."""
        if isinstance(schema, list):
            return schema, "union"
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                return schema, schema
            if schema not in self._named:
                raise NotFast
            schema = self._named[schema]
        if not isinstance(schema, dict):
            raise NotFast
        kind = schema.get("type")
        if isinstance(kind, (dict, list)) or kind not in _KINDS:
            raise NotFast  # "error", a nested type object, a reference as a type: fastavro's
        name = schema.get("name")
        if isinstance(name, str) and kind in _NAMED:
            self._named.setdefault(name, schema)
        return schema, kind

    def _once(self, what: str, schema: Any, kind: str, build: Callable[[], _Built]) -> _Built:
        """``build()``, or what it gave (or raised) for this named type before."""
        name = schema.get("name") if kind in _NAMED else None
        if not isinstance(name, str):
            return build()
        key = (what, name)
        built = self._built.get(key)
        if built is _FAILED:
            raise NotFast
        if built is None:
            try:
                built = build()
            except NotFast:
                self._built[key] = _FAILED
                raise
            self._built[key] = built
        return cast(_Built, built)

    @contextmanager
    def _record(self, schema: dict[str, Any]) -> Iterator[None]:
        """While a record's fields are built: a reference to it from inside is a recursive
        type, which the closures leave to fastavro."""
        name = schema["name"]
        if name in self._building:
            raise NotFast
        self._building.add(name)
        try:
            yield
        finally:
            self._building.discard(name)

    def reader(self, schema: Any) -> Read:
        schema, kind = self._resolve(schema)
        if kind == "union":
            return _reader_union(tuple(self.reader(branch) for branch in schema))
        return self._once("read", schema, kind, lambda: self._reader_logical(schema, kind))

    def _reader_logical(self, schema: Any, kind: str) -> Read:
        read = self._reader_of(schema, kind)
        convert = _logical(LOGICAL_READERS, schema, kind)
        return read if convert is None else _reader_logical(read, convert, schema)

    def _reader_of(self, schema: Any, kind: str) -> Read:
        if kind in _PRIMITIVE_READERS:
            return _PRIMITIVE_READERS[kind]
        if kind == "fixed":
            return _reader_fixed(_size(schema))
        if kind == "enum":
            return _reader_enum(tuple(schema["symbols"]))
        if kind == "array":
            item = self.reader(schema["items"])
            if self._min_width(schema["items"]) == 0:
                self.zero_width_arrays = True
                return _reader_zero_width_array(item, self.budget)
            return _reader_array(item)
        if kind == "map":
            return _reader_map(self.reader(schema["values"]))
        with self._record(schema):
            return _reader_record(
                tuple((field["name"], self.reader(field["type"])) for field in schema["fields"])
            )

    def writer(self, schema: Any, validating: bool = False) -> Write:
        schema, kind = self._resolve(schema)
        if kind == "union":
            return self._writer_union(schema)
        what = "write-validating" if validating else "write"
        return self._once(
            what, schema, kind, lambda: self._writer_logical(schema, kind, validating)
        )

    def _writer_logical(self, schema: Any, kind: str, validating: bool) -> Write:
        write = self._writer_of(schema, kind, validating)
        prepare = _logical(LOGICAL_WRITERS, schema, kind)
        # fastavro validates a logical value as the base type of what prepare made of it, and
        # the closures' base writers take only what that validation accepts.
        return write if prepare is None else _writer_logical(write, prepare, schema)

    def _writer_union(self, branches: list[Any]) -> Write:
        takers: dict[type, list[int]] = {}
        logical: list[int] = []  # branches fastavro prepares a value for first: any type may do
        for i, member in enumerate(branches):
            schema, kind = self._resolve(member)
            if kind == "union":
                raise NotFast
            prepare = _logical(LOGICAL_WRITERS, schema, kind)
            if prepare is None:
                for python_type in _VALIDATES[kind]:
                    takers.setdefault(python_type, []).append(i)
                continue
            logical.append(i)
            if _takes_none(prepare, schema, kind):
                takers.setdefault(type(None), []).append(i)
        for python_type, indexes in takers.items():
            if python_type is not type(None):
                indexes.extend(logical)
        built: dict[int, Branch | None] = {}

        def branch(i: int) -> Branch | None:  # built once, for every type it is picked for
            if i not in built:
                try:
                    index = bytearray()
                    _write_varint(i, index)
                    built[i] = (bytes(index), self.writer(branches[i], True))
                except NotFast:  # a recursive type: its values are fastavro's
                    built[i] = None
            return built[i]

        picked = {t: branch(ix[0]) if len(ix) == 1 else None for t, ix in takers.items()}
        return _writer_by_type(picked, branch(logical[0]) if len(logical) == 1 else None)

    def _writer_of(self, schema: Any, kind: str, validating: bool) -> Write:
        if kind in _PRIMITIVE_WRITERS:
            return _PRIMITIVE_WRITERS[kind]
        if kind == "fixed":
            return _writer_fixed(_size(schema))
        if kind == "enum":
            return _writer_enum(tuple(schema["symbols"]))
        if kind == "array":
            return _writer_array(self.writer(schema["items"], validating))
        if kind == "map":
            return _writer_map(self.writer(schema["values"], validating))
        with self._record(schema):
            fields = tuple(
                (field["name"], self.writer(field["type"], validating))
                for field in schema["fields"]
            )
        return _writer_record(fields, validating)

    def _min_width(self, schema: Any, depth: int = 0) -> int:
        """Bytes the smallest value of ``schema`` takes (0 or at least 1)."""
        schema, kind = self._resolve(schema)
        if depth > 64:
            raise NotFast
        return self._once("width", schema, kind, lambda: self._min_width_of(schema, kind, depth))

    def _min_width_of(self, schema: Any, kind: str, depth: int) -> int:
        if kind == "null":
            return 0
        if kind == "fixed":
            return min(_size(schema), 1)
        if kind == "record":
            return min(
                sum(self._min_width(field["type"], depth + 1) for field in schema["fields"]), 1
            )
        return 1  # a varint, a length, a count, a union's index or a float's bytes


def build_reader(schema: Any) -> Read | None:
    """Closures that read values of a parsed writer schema, or None if fastavro must."""
    try:
        builder = _Builder(schema)
        read = builder.reader(schema)
    except (NotFast, KeyError, TypeError, ValueError, RecursionError):
        return None
    return _reader_budgeted(read, builder.budget) if builder.zero_width_arrays else read


def build_writer(schema: Any) -> Write | None:
    """Closures that write values of a parsed schema, or None if fastavro must."""
    try:
        return _Builder(schema).writer(schema)
    except (NotFast, KeyError, TypeError, ValueError, RecursionError):
        return None
