"""A protobuf message class for the tests, built from its descriptor at import time.

What protoc would generate for::

    syntax = "proto3";
    package offtake.test;
    message Order { int64 id = 1; string item = 2; double amount = 3; }

built here with descriptor_pb2 so that the tests need no protoc. Worker processes import it as
``source.protobufMessage: support.orders_pb:Order``.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.message_factory import GetMessageClass

_FIELD = descriptor_pb2.FieldDescriptorProto


def _file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(
        name="offtake_test_orders.proto", package="offtake.test", syntax="proto3"
    )
    order = fd.message_type.add(name="Order")
    for number, (name, kind) in enumerate(
        (("id", _FIELD.TYPE_INT64), ("item", _FIELD.TYPE_STRING), ("amount", _FIELD.TYPE_DOUBLE)),
        start=1,
    ):
        order.field.add(name=name, number=number, type=kind, label=_FIELD.LABEL_OPTIONAL)
    return fd


def _message_class() -> Any:
    pool = descriptor_pool.Default()
    try:
        found = pool.FindMessageTypeByName("offtake.test.Order")
    except KeyError:
        pool.Add(_file())
        found = pool.FindMessageTypeByName("offtake.test.Order")
    return GetMessageClass(found)


Order: Any = _message_class()
