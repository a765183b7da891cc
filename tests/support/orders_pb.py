"""A protobuf message class for the tests, built from its descriptor at import time.

What protoc would generate for::

    syntax = "proto3";
    package offtake.test;
    message Order { int64 id = 1; string item = 2; double amount = 3; }

built here with descriptor_pb2 so that the tests need no protoc. Worker processes import it as
``source.protobufMessage: support.orders_pb:Order``.

``RichOrder`` (its own file, ``offtake_test_rich_orders.proto``) has one field of each kind
the Spark sink maps to a column type::

    import "google/protobuf/timestamp.proto";
    message RichOrder {
      enum Tier { BASIC = 0; GOLD = 1; }
      message Customer { string name = 1; Tier tier = 2; }
      message Line { string sku = 1; int32 qty = 2; }
      int64 id = 1; Customer customer = 2; repeated Line lines = 3;
      map<string, string> attrs = 4; double total = 5; google.protobuf.Timestamp placed = 6;
      bytes blob = 7;
    }
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, timestamp_pb2

from support.record_schemas import ORDER, flat_messages, message_classes

_FIELD = descriptor_pb2.FieldDescriptorProto

Order: Any = flat_messages("offtake_test_orders.proto", ORDER)[0]


def _rich_file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(
        name="offtake_test_rich_orders.proto",
        package="offtake.test",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
    )
    rich = fd.message_type.add(name="RichOrder")
    tier = rich.enum_type.add(name="Tier")
    tier.value.add(name="BASIC", number=0)
    tier.value.add(name="GOLD", number=1)
    customer = rich.nested_type.add(name="Customer")
    customer.field.add(name="name", number=1, type=_FIELD.TYPE_STRING)
    customer.field.add(
        name="tier", number=2, type=_FIELD.TYPE_ENUM, type_name=".offtake.test.RichOrder.Tier"
    )
    line = rich.nested_type.add(name="Line")
    line.field.add(name="sku", number=1, type=_FIELD.TYPE_STRING)
    line.field.add(name="qty", number=2, type=_FIELD.TYPE_INT32)
    entry = rich.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=_FIELD.TYPE_STRING)
    entry.field.add(name="value", number=2, type=_FIELD.TYPE_STRING)
    rich.field.add(name="id", number=1, type=_FIELD.TYPE_INT64)
    rich.field.add(
        name="customer",
        number=2,
        type=_FIELD.TYPE_MESSAGE,
        type_name=".offtake.test.RichOrder.Customer",
    )
    rich.field.add(
        name="lines",
        number=3,
        type=_FIELD.TYPE_MESSAGE,
        label=_FIELD.LABEL_REPEATED,
        type_name=".offtake.test.RichOrder.Line",
    )
    rich.field.add(
        name="attrs",
        number=4,
        type=_FIELD.TYPE_MESSAGE,
        label=_FIELD.LABEL_REPEATED,
        type_name=".offtake.test.RichOrder.AttrsEntry",
    )
    rich.field.add(name="total", number=5, type=_FIELD.TYPE_DOUBLE)
    rich.field.add(
        name="placed", number=6, type=_FIELD.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp"
    )
    rich.field.add(name="blob", number=7, type=_FIELD.TYPE_BYTES)
    return fd


assert timestamp_pb2.Timestamp.DESCRIPTOR.full_name  # its file is in the pool first
RichOrder: Any = message_classes(_rich_file, "offtake.test.RichOrder")[0]
