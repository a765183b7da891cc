"""Record schemas written once for the three registry formats (Avro, JSON Schema, Protobuf),
for the tests' records and the bench's (bench/bench_schemas.py).

Only the standard library is imported here, protobuf on first use: the bench's contenders
import this module from virtualenvs that have neither offtake nor the test suite's packages.
Protobuf classes are built from descriptors (no protoc) in protobuf's default pool, where a
worker process that names them (``source.protobufMessage``) finds them too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: A scalar field's kind: its Avro type, JSON Schema type and protobuf field type.
KINDS = {
    "long": ("long", "integer", "TYPE_INT64"),
    "string": ("string", "string", "TYPE_STRING"),
    "double": ("double", "number", "TYPE_DOUBLE"),
    "boolean": ("boolean", "boolean", "TYPE_BOOL"),
}


def json_schema(title: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """A draft-07 JSON Schema of an object."""
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": title,
        "type": "object",
        "properties": properties,
        "required": required,
    }


@dataclass(frozen=True)
class FlatRecord:
    """A record of scalar fields (name, a kind of :data:`KINDS`), every one required: the
    same record as an Avro schema, a JSON Schema and a protobuf message. ``package`` is the
    Avro namespace and the protobuf package."""

    name: str
    package: str
    fields: tuple[tuple[str, str], ...]

    def extended(self, name: str, *fields: tuple[str, str]) -> FlatRecord:
        """Another record with this one's fields and ``fields`` after them."""
        return FlatRecord(name, self.package, (*self.fields, *fields))

    def avro(self) -> dict[str, Any]:
        return {
            "type": "record",
            "name": self.name,
            "namespace": self.package,
            "fields": [{"name": n, "type": KINDS[kind][0]} for n, kind in self.fields],
        }

    def json_schema(self) -> dict[str, Any]:
        properties = {n: {"type": KINDS[kind][1]} for n, kind in self.fields}
        return json_schema(self.name, properties, [n for n, _ in self.fields])


#: The tests' order record (support.schemas.order makes its values).
ORDER = FlatRecord(
    "Order", "offtake.test", (("id", "long"), ("item", "string"), ("amount", "double"))
)


def message_classes(make_file: Callable[[], Any], *names: str) -> list[Any]:
    """The classes of the messages ``names`` (full names), from protobuf's default pool; the
    file ``make_file()`` (a FileDescriptorProto) is added to it first unless an earlier
    import did. The files it depends on must be in the pool already."""
    from google.protobuf import descriptor_pool
    from google.protobuf.message_factory import GetMessageClass

    pool = descriptor_pool.Default()
    try:
        pool.FindMessageTypeByName(names[0])
    except KeyError:
        pool.Add(make_file())
    return [GetMessageClass(pool.FindMessageTypeByName(name)) for name in names]


def flat_messages(file_name: str, *records: FlatRecord) -> list[Any]:
    """The protobuf classes of ``records`` (of one package), in proto3 file ``file_name``
    with the messages in that order (a message's index in the wire format is its place)."""
    package = records[0].package

    def make_file() -> Any:
        from google.protobuf import descriptor_pb2

        field = descriptor_pb2.FieldDescriptorProto
        fd = descriptor_pb2.FileDescriptorProto(name=file_name, package=package, syntax="proto3")
        for record in records:
            message = fd.message_type.add(name=record.name)
            for number, (name, kind) in enumerate(record.fields, start=1):
                kind_type = getattr(field, KINDS[kind][2])
                message.field.add(
                    name=name, number=number, type=kind_type, label=field.LABEL_OPTIONAL
                )
        return fd

    return message_classes(make_file, *(f"{package}.{r.name}" for r in records))
