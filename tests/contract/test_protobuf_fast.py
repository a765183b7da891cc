"""offtake.formats.protobuf_fast against json_format, which it stands in for on the hot path.

Its rule: a closure gives exactly what ``MessageToDict`` (the worker's options) and
``ParseDict(...).SerializeToString()`` give, or raises (and then json_format answers). Held
here on generated messages of every scalar kind (the dict's key order too), on odd values of
neighbouring Python types, and through ProtobufDecoder and ProtobufEncoder.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.json_format import MessageToDict, ParseDict
from support.diff_pb import Everything
from support.record_schemas import message_classes

from offtake.formats.protobuf import _TO_DICT, ProtobufEncoder
from offtake.formats.protobuf_fast import build_from_dict, build_to_dict

VALUES = 400
_F = descriptor_pb2.FieldDescriptorProto
SCALARS = {
    "i32": (_F.TYPE_INT32, [0, 1, -1, 2**31 - 1, -(2**31)]),
    "i64": (_F.TYPE_INT64, [0, -1, 2**53, 2**53 + 1, 2**63 - 1, -(2**63)]),
    "u32": (_F.TYPE_UINT32, [0, 1, 2**32 - 1]),
    "u64": (_F.TYPE_UINT64, [0, 2**53 + 1, 2**64 - 1]),
    "s32": (_F.TYPE_SINT32, [0, -5, 2**31 - 1]),
    "s64": (_F.TYPE_SINT64, [0, -(2**63), 2**62]),
    "f32": (_F.TYPE_FIXED32, [0, 2**32 - 1]),
    "f64": (_F.TYPE_FIXED64, [0, 2**64 - 1]),
    "sf32": (_F.TYPE_SFIXED32, [0, -(2**31)]),
    "sf64": (_F.TYPE_SFIXED64, [0, -(2**63)]),
    "d": (_F.TYPE_DOUBLE, [0.0, -0.0, 1.5, 1e308, 5e-324, math.inf, -math.inf, math.nan]),
    "flag": (_F.TYPE_BOOL, [True, False]),
    "text": (_F.TYPE_STRING, ["", "a", "é€𝄞", "x" * 300]),
}


def _file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(
        name="offtake_test_pbfast.proto", package="offtake.pbfast", syntax="proto3"
    )
    m = fd.message_type.add(name="Flat")
    kind = m.enum_type.add(name="Kind")
    for n, name in enumerate(("NONE", "ONE", "TWO")):
        kind.value.add(name=name, number=n)
    number = 1
    for name, (kind_type, _) in SCALARS.items():
        m.field.add(name=name, number=number, type=kind_type)
        m.field.add(name=f"many_{name}", number=number + 1, type=kind_type, label=_F.LABEL_REPEATED)
        number += 2
    enum = ".offtake.pbfast.Flat.Kind"
    m.field.add(name="kind", number=100, type=_F.TYPE_ENUM, type_name=enum)
    m.field.add(
        name="kinds", number=101, type=_F.TYPE_ENUM, type_name=enum, label=_F.LABEL_REPEATED
    )
    # proto3 optional: presence, through a synthetic oneof of one field
    for i, (name, kind_type) in enumerate(
        (("opt_text", _F.TYPE_STRING), ("opt_i64", _F.TYPE_INT64))
    ):
        m.oneof_decl.add(name=f"_{name}")
        m.field.add(name=name, number=200 + i, type=kind_type, oneof_index=i, proto3_optional=True)
    m.field.add(name="late_first", number=5000, type=_F.TYPE_INT32)  # declared last, numbered high
    small = fd.message_type.add(name="Small")
    small.field.add(name="z", number=9, type=_F.TYPE_INT32)
    small.field.add(name="a", number=1, type=_F.TYPE_STRING)  # declared after z, numbered first
    fd.message_type.add(name="Single").field.add(name="f", number=1, type=_F.TYPE_FLOAT)
    return fd


Flat, Small, Single = message_classes(
    _file, "offtake.pbfast.Flat", "offtake.pbfast.Small", "offtake.pbfast.Single"
)


def _plain(value: Any) -> bool:
    # its JSON form is the Python value itself: not "NaN", nor an int64 past 2**53 as a string
    return float(value) == value if not isinstance(value, str) else True


def _messages(rng: random.Random, plain: bool = False) -> list[Any]:
    out = [Flat(), Small(), Small(z=1), Small(a="x")]
    for _ in range(VALUES):
        m = Flat()
        for name, (_, every) in SCALARS.items():
            values = [v for v in every if _plain(v)] if plain else every
            if rng.random() < 0.7:
                setattr(m, name, rng.choice(values))
            getattr(m, f"many_{name}").extend(rng.choice(values) for _ in range(rng.randint(0, 3)))
        if rng.random() < 0.7:
            m.kind = rng.choice([0, 1, 2, 7])  # 7: an open enum's number with no name
        m.kinds.extend(rng.choice([0, 1, 2]) for _ in range(rng.randint(0, 3)))
        if rng.random() < 0.5:
            m.opt_text = rng.choice(["", "set"])
        if rng.random() < 0.5:
            m.opt_i64 = rng.choice([0, 2**60])
        if rng.random() < 0.3:
            m.late_first = 3
        out.append(m)
    return out


def _outcome(call: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "value", repr(call(*args))  # repr: NaN, and the dict's key order
    except Exception as exc:
        return "error", type(exc).__name__


def test_messages_become_the_dict_message_to_dict_makes_key_for_key_in_order() -> None:
    converters = {cls: build_to_dict(cls, _TO_DICT) for cls in (Flat, Small)}
    fast = unnamed = 0
    for message in _messages(random.Random("pb-to-dict")):
        to_dict = converters[type(message)]
        assert to_dict is not None
        expected = _outcome(lambda m: MessageToDict(m, **_TO_DICT), message)
        try:
            got = repr(to_dict(message))
        except KeyError:
            unnamed += 1  # an enum number with no name: json_format's (it prints the number)
            continue
        assert ("value", got) == expected, message
        fast += 1
    assert fast > VALUES // 2 and unnamed


def test_dicts_become_the_bytes_parse_dict_makes() -> None:
    from_dict = build_from_dict(Flat)
    assert from_dict is not None
    encoder = ProtobufEncoder(Flat, b"")
    written = left = 0
    messages = _messages(random.Random("pb-from-dict"), plain=True)
    for message in messages + _messages(random.Random("pb-from-dict-any"))[:100]:
        if not isinstance(message, Flat) or message.kind == 7:
            continue
        value = MessageToDict(message, **_TO_DICT)
        try:
            data = from_dict(value)
        except Exception:  # "NaN", an int64 past 2**53 as a string: ParseDict's to read
            left += 1
            assert _outcome(encoder.encode, value) == _outcome(
                lambda v: ParseDict(v, Flat()).SerializeToString(), value
            )
            continue
        assert data == ParseDict(value, Flat()).SerializeToString()
        written += 1
    assert written > VALUES // 4 and left


ODD = [
    ("i32", True),
    ("i32", 1.0),
    ("i32", "1"),
    ("i32", 2**31),
    ("u32", -1),
    ("u64", 2**64),
    ("i64", "9007199254740993"),
    ("d", 1),
    ("d", math.nan),
    ("d", math.inf),
    ("d", "NaN"),
    ("flag", 1),
    ("flag", "true"),
    ("text", b"x"),
    ("text", "\ud800"),
    ("text", None),
    ("kind", 1),
    ("kind", "THREE"),
    ("kind", "ONE"),
    ("kinds", ["ONE", 2]),
    ("many_i32", (1, 2)),
    ("many_i32", [1, "2"]),
    ("many_d", [1.5, 2]),
    ("opt_text", None),
    ("manyI32", [1]),
    ("unknown", 1),
]


@pytest.mark.parametrize(("key", "odd"), ODD, ids=[f"{k}={v!r}" for k, v in ODD])
def test_odd_values_are_encoded_as_parse_dict_does_or_left_to_it(key: str, odd: Any) -> None:
    encoder = ProtobufEncoder(Flat, b"\x00\x00\x00\x00\x09\x00")
    value = {"i32": 5, "text": "t", key: odd}
    ours = _outcome(encoder.encode, value)
    theirs = _outcome(
        lambda v: b"\x00\x00\x00\x00\x09\x00" + ParseDict(v, Flat()).SerializeToString(), value
    )
    assert ours == theirs


def test_messages_the_closures_do_not_take_are_json_formats() -> None:
    for cls in (Everything, Single):  # nested messages, maps, bytes, oneofs, WKTs; float32
        assert build_to_dict(cls, _TO_DICT) is None
        assert build_from_dict(cls) is None
    assert build_to_dict(Flat, {"preserving_proto_field_name": True}) is None  # other options
