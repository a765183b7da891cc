"""Protobuf messages turned into protobuf's JSON mapping and back by closures built once per
message class, for the hot path.

``json_format``'s ``MessageToDict`` and ``ParseDict`` are pure Python walks that look every
field's kind up per value: about 4.7 and 12.4 µs for the bench's four-field message, against a
field loop over ``ListFields`` and the class's own constructor here.

The same rule as :mod:`offtake.formats.avro_fast`: **a closure gives exactly what json_format
gives, or raises**, and then json_format answers (its dict, its bytes, its error). Built only
for a message whose every field is a scalar (numbers but float32, bool, string, enums; repeated
or not, with presence or not); a message with a nested message, a map, bytes, float32, a real
oneof or extensions is json_format's throughout (``build_*`` return None).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict

from offtake.formats.errors import NotFast

ToDict = Callable[[Any], dict[str, Any]]  # a message -> its JSON mapping
FromDict = Callable[[Any], bytes]  # a JSON mapping -> the message's bytes

_INT_RANGES = {
    FieldDescriptor.CPPTYPE_INT32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.CPPTYPE_UINT32: (0, (1 << 32) - 1),
    FieldDescriptor.CPPTYPE_INT64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.CPPTYPE_UINT64: (0, (1 << 64) - 1),
}
_INT64 = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)
_LIST = object()  # a repeated field's default: a new empty list each time


def _flat_fields(descriptor: Descriptor) -> list[FieldDescriptor] | None:
    """The fields of a message the closures take, or None."""
    if descriptor.extension_ranges:
        return None
    fields = list(descriptor.fields)
    by_json_name: dict[str, list[FieldDescriptor]] = {}
    for field in fields:
        by_json_name.setdefault(field.json_name, []).append(field)
    for field in fields:
        if field.message_type is not None or field.cpp_type == FieldDescriptor.CPPTYPE_FLOAT:
            return None  # a message, a map, a group; float32's shortest form is json_format's
        if field.type == FieldDescriptor.TYPE_BYTES:
            return None  # base64 both ways
        oneof = field.containing_oneof
        if oneof is not None and len(oneof.fields) > 1:
            return None  # ParseDict refuses two of a oneof, the constructor keeps the last
        if any(other is not field for other in by_json_name.get(field.name, ())):
            return None  # ParseDict reads a key by JSON name first: another field's, here
        if field.enum_type is not None and any(
            v.GetOptions().ListFields() for v in field.enum_type.values
        ):
            return None  # an enum value's options may rename it in JSON
    return fields


# -- to a dict ---------------------------------------------------------------------------------


def _int64_out(value: Any) -> Any:
    return value if float(value) == value else str(value)  # json_format's unquote_int64


def _double_out(value: Any) -> Any:
    if math.isinf(value):
        return "-Infinity" if value < 0.0 else "Infinity"
    if math.isnan(value):
        return "NaN"
    return value


def _same(value: Any) -> Any:
    return value


def _enum_out(message_class: Any, field: FieldDescriptor, options: dict[str, Any]) -> Any:
    # Each value's JSON form, as json_format itself prints it (asked once, here).
    names: dict[int, Any] = {}
    for enum_value in field.enum_type.values:
        probe = message_class()
        if field.is_repeated:
            getattr(probe, field.name).append(enum_value.number)
        else:
            setattr(probe, field.name, enum_value.number)
        printed = MessageToDict(probe, **options).get(field.name)
        names[enum_value.number] = printed[0] if field.is_repeated else printed

    def out(value: Any) -> Any:
        return names[value]  # KeyError for a number the enum does not name: json_format's

    return out


def _out(message_class: Any, field: FieldDescriptor, options: dict[str, Any]) -> Any:
    if field.enum_type is not None:
        return _enum_out(message_class, field, options)
    if field.cpp_type in _INT64 and options.get("unquote_int64_if_possible"):
        return _int64_out
    if field.cpp_type in _INT64:
        return str
    if field.cpp_type == FieldDescriptor.CPPTYPE_DOUBLE:
        return _double_out
    if field.cpp_type == FieldDescriptor.CPPTYPE_BOOL:
        return bool
    return _same  # int32 kinds; a string is already one


def build_to_dict(message_class: Any, options: dict[str, Any]) -> ToDict | None:
    """``MessageToDict(message, **options)`` for messages of ``message_class`` (field names as
    declared, fields with no presence always printed), or None if json_format must."""
    if not (
        options.get("preserving_proto_field_name")
        and options.get("always_print_fields_with_no_presence")
    ):
        return None
    fields = _flat_fields(message_class.DESCRIPTOR)
    if fields is None:
        return None
    by_number: dict[int, tuple[str, Callable[[Any], Any], bool]] = {}
    defaults: list[tuple[str, Any]] = []  # printed after the set fields, in declared order
    for field in fields:
        out = _out(message_class, field, options)
        by_number[field.number] = (field.name, out, field.is_repeated)
        if not field.has_presence:
            defaults.append((field.name, _LIST if field.is_repeated else out(field.default_value)))

    def to_dict(message: Any) -> dict[str, Any]:
        js: dict[str, Any] = {}
        for field, value in message.ListFields():  # set fields, by number
            name, out, repeated = by_number[field.number]
            js[name] = [out(v) for v in value] if repeated else out(value)
        for name, default in defaults:
            if name not in js:
                js[name] = [] if default is _LIST else default
        return js

    return to_dict


# -- from a dict -------------------------------------------------------------------------------


def _check(field: FieldDescriptor) -> Callable[[Any], bool]:
    """Whether ParseDict takes ``value`` for one element of ``field`` as the constructor does."""
    if field.enum_type is not None:
        names = frozenset(v.name for v in field.enum_type.values)
        return lambda value: type(value) is str and value in names
    if field.cpp_type in _INT_RANGES:
        low, high = _INT_RANGES[field.cpp_type]
        return lambda value: type(value) is int and low <= value <= high
    if field.cpp_type == FieldDescriptor.CPPTYPE_DOUBLE:
        # ParseDict refuses an unquoted NaN or infinity; an int is converted (json_format's)
        return lambda value: type(value) is float and math.isfinite(value)
    if field.cpp_type == FieldDescriptor.CPPTYPE_BOOL:
        return lambda value: type(value) is bool
    return lambda value: type(value) is str


def _check_repeated(element: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: type(value) is list and all(element(v) for v in value)


def build_from_dict(message_class: Any) -> FromDict | None:
    """``ParseDict(value, message_class()).SerializeToString()`` for a dict of the message's
    fields by their declared names, or None if json_format must."""
    fields = _flat_fields(message_class.DESCRIPTOR)
    if fields is None:
        return None
    checks = {f.name: _check_repeated(_check(f)) if f.is_repeated else _check(f) for f in fields}

    def from_dict(value: Any) -> bytes:
        if type(value) is not dict:
            raise NotFast
        for key, element in value.items():
            check = checks.get(key)  # a JSON name, an unknown key: json_format's
            if check is None or not check(element):
                raise NotFast
        data: bytes = message_class(**value).SerializeToString()
        return data

    return from_dict
