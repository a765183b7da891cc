"""A protobuf message with one field of each kind the differential format tests cover, built
from its descriptor at import time (no protoc). What protoc would generate for::

    syntax = "proto3";
    package offtake.diff;
    import "google/protobuf/timestamp.proto"; import "google/protobuf/duration.proto";
    import "google/protobuf/wrappers.proto"; import "google/protobuf/struct.proto";
    message Other { string note = 1; }                 // first: Everything's message index is [1]
    message Everything {
      enum Color { RED = 0; GREEN = 1; BLUE = 2; }
      message Point { double x = 1; double y = 2; message Tag { string name = 1; } Tag tag = 3; }
      int64 id = 1; int32 i = 2; uint64 u = 3; sint64 s = 4; float f = 5; double d = 6;
      bool flag = 7; string text = 8; bytes blob = 9; Color color = 10;
      Point point = 11; repeated Point points = 12; repeated int64 numbers = 13;
      map<string, int64> counts = 14; map<int32, Point> by_id = 15;
      oneof choice { string name = 16; int64 number = 17; Point at = 18; }
      google.protobuf.Timestamp placed = 19; google.protobuf.Duration took = 20;
      google.protobuf.Int64Value maybe_long = 21; google.protobuf.StringValue maybe_text = 22;
      google.protobuf.BoolValue maybe_flag = 23; google.protobuf.DoubleValue maybe_double = 24;
      google.protobuf.BytesValue maybe_blob = 25; google.protobuf.Struct extra = 26;
      optional string opt = 27;
    }
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, duration_pb2, struct_pb2, timestamp_pb2, wrappers_pb2

from support.record_schemas import message_classes

_F = descriptor_pb2.FieldDescriptorProto
_WKT = (timestamp_pb2, duration_pb2, wrappers_pb2, struct_pb2)


def _file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(
        name="offtake_test_diff.proto",
        package="offtake.diff",
        syntax="proto3",
        dependency=[m.DESCRIPTOR.name for m in _WKT],
    )
    fd.message_type.add(name="Other").field.add(name="note", number=1, type=_F.TYPE_STRING)
    m = fd.message_type.add(name="Everything")
    color = m.enum_type.add(name="Color")
    for n, name in enumerate(("RED", "GREEN", "BLUE")):
        color.value.add(name=name, number=n)
    point = m.nested_type.add(name="Point")
    point.field.add(name="x", number=1, type=_F.TYPE_DOUBLE)
    point.field.add(name="y", number=2, type=_F.TYPE_DOUBLE)
    point.nested_type.add(name="Tag").field.add(name="name", number=1, type=_F.TYPE_STRING)
    point.field.add(
        name="tag", number=3, type=_F.TYPE_MESSAGE, type_name=".offtake.diff.Everything.Point.Tag"
    )
    pt = ".offtake.diff.Everything.Point"
    counts = m.nested_type.add(name="CountsEntry")
    counts.options.map_entry = True
    counts.field.add(name="key", number=1, type=_F.TYPE_STRING)
    counts.field.add(name="value", number=2, type=_F.TYPE_INT64)
    by_id = m.nested_type.add(name="ByIdEntry")
    by_id.options.map_entry = True
    by_id.field.add(name="key", number=1, type=_F.TYPE_INT32)
    by_id.field.add(name="value", number=2, type=_F.TYPE_MESSAGE, type_name=pt)
    rep = _F.LABEL_REPEATED
    scalars = [
        ("id", _F.TYPE_INT64),
        ("i", _F.TYPE_INT32),
        ("u", _F.TYPE_UINT64),
        ("s", _F.TYPE_SINT64),
        ("f", _F.TYPE_FLOAT),
        ("d", _F.TYPE_DOUBLE),
        ("flag", _F.TYPE_BOOL),
        ("text", _F.TYPE_STRING),
        ("blob", _F.TYPE_BYTES),
    ]
    for n, (name, kind) in enumerate(scalars, start=1):
        m.field.add(name=name, number=n, type=kind)
    m.field.add(
        name="color", number=10, type=_F.TYPE_ENUM, type_name=".offtake.diff.Everything.Color"
    )
    m.field.add(name="point", number=11, type=_F.TYPE_MESSAGE, type_name=pt)
    m.field.add(name="points", number=12, type=_F.TYPE_MESSAGE, type_name=pt, label=rep)
    m.field.add(name="numbers", number=13, type=_F.TYPE_INT64, label=rep)
    m.field.add(
        name="counts", number=14, type=_F.TYPE_MESSAGE, label=rep,
        type_name=".offtake.diff.Everything.CountsEntry",
    )  # fmt: skip
    m.field.add(
        name="by_id", number=15, type=_F.TYPE_MESSAGE, label=rep,
        type_name=".offtake.diff.Everything.ByIdEntry",
    )  # fmt: skip
    m.oneof_decl.add(name="choice")
    m.field.add(name="name", number=16, type=_F.TYPE_STRING, oneof_index=0)
    m.field.add(name="number", number=17, type=_F.TYPE_INT64, oneof_index=0)
    m.field.add(name="at", number=18, type=_F.TYPE_MESSAGE, type_name=pt, oneof_index=0)
    wkt = [
        ("placed", "Timestamp"),
        ("took", "Duration"),
        ("maybe_long", "Int64Value"),
        ("maybe_text", "StringValue"),
        ("maybe_flag", "BoolValue"),
        ("maybe_double", "DoubleValue"),
        ("maybe_blob", "BytesValue"),
        ("extra", "Struct"),
    ]
    for n, (name, kind) in enumerate(wkt, start=19):
        m.field.add(name=name, number=n, type=_F.TYPE_MESSAGE, type_name=f".google.protobuf.{kind}")
    # proto3 `optional`: a synthetic oneof of its own.
    m.oneof_decl.add(name="_opt")
    m.field.add(name="opt", number=27, type=_F.TYPE_STRING, oneof_index=1, proto3_optional=True)
    return fd


assert all(m.DESCRIPTOR.name for m in _WKT)  # their files are in the pool first
Everything: Any = message_classes(_file, "offtake.diff.Everything")[0]
