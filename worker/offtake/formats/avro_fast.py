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
  of no fields, a fixed of size 0) is read by the closures themselves, within a budget of
  such items per byte of the value (:mod:`offtake.formats.avro_readers`).

This module walks a schema into the closures; they are in :mod:`offtake.formats.avro_readers`
and :mod:`offtake.formats.avro_writers`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from fastavro.read import LOGICAL_READERS
from fastavro.write import LOGICAL_WRITERS

from offtake.formats.avro_readers import (
    PRIMITIVE_READERS,
    Budget,
    Read,
    reader_array,
    reader_budgeted,
    reader_enum,
    reader_fixed,
    reader_logical,
    reader_map,
    reader_record,
    reader_union,
    reader_zero_width_array,
)
from offtake.formats.avro_writers import (
    PRIMITIVE_WRITERS,
    Branch,
    Write,
    write_varint,
    writer_array,
    writer_by_type,
    writer_enum,
    writer_fixed,
    writer_logical,
    writer_map,
    writer_record,
)
from offtake.formats.errors import NotFast

_PRIMITIVES = frozenset(("null", "boolean", "int", "long", "float", "double", "bytes", "string"))
_KINDS = _PRIMITIVES | {"record", "enum", "fixed", "array", "map"}  # a type object's "type"
_NAMED = ("record", "enum", "fixed")

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
        self.budget = Budget()  # shared by every zero-width array of this schema's readers
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
            return reader_union(tuple(self.reader(branch) for branch in schema))
        return self._once("read", schema, kind, lambda: self._reader_logical(schema, kind))

    def _reader_logical(self, schema: Any, kind: str) -> Read:
        read = self._reader_of(schema, kind)
        convert = _logical(LOGICAL_READERS, schema, kind)
        return read if convert is None else reader_logical(read, convert, schema)

    def _reader_of(self, schema: Any, kind: str) -> Read:
        if kind in PRIMITIVE_READERS:
            return PRIMITIVE_READERS[kind]
        if kind == "fixed":
            return reader_fixed(_size(schema))
        if kind == "enum":
            return reader_enum(tuple(schema["symbols"]))
        if kind == "array":
            item = self.reader(schema["items"])
            if self._min_width(schema["items"]) == 0:
                self.zero_width_arrays = True
                return reader_zero_width_array(item, self.budget)
            return reader_array(item)
        if kind == "map":
            return reader_map(self.reader(schema["values"]))
        with self._record(schema):
            return reader_record(
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
        return write if prepare is None else writer_logical(write, prepare, schema)

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
                    write_varint(i, index)
                    built[i] = (bytes(index), self.writer(branches[i], True))
                except NotFast:  # a recursive type: its values are fastavro's
                    built[i] = None
            return built[i]

        picked = {t: branch(ix[0]) if len(ix) == 1 else None for t, ix in takers.items()}
        return writer_by_type(picked, branch(logical[0]) if len(logical) == 1 else None)

    def _writer_of(self, schema: Any, kind: str, validating: bool) -> Write:
        if kind in PRIMITIVE_WRITERS:
            return PRIMITIVE_WRITERS[kind]
        if kind == "fixed":
            return writer_fixed(_size(schema))
        if kind == "enum":
            return writer_enum(tuple(schema["symbols"]))
        if kind == "array":
            return writer_array(self.writer(schema["items"], validating))
        if kind == "map":
            return writer_map(self.writer(schema["values"], validating))
        with self._record(schema):
            fields = tuple(
                (field["name"], self.writer(field["type"], validating))
                for field in schema["fields"]
            )
        return writer_record(fields, validating)

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
    return reader_budgeted(read, builder.budget) if builder.zero_width_arrays else read


def build_writer(schema: Any) -> Write | None:
    """Closures that write values of a parsed schema, or None if fastavro must."""
    try:
        return _Builder(schema).writer(schema)
    except (NotFast, KeyError, TypeError, ValueError, RecursionError):
        return None
