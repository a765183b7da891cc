"""The Kafka sink's schema: which one values are encoded with, resolved when the worker starts,
so that a missing or incompatible schema stops the worker with a message that says which and
why, instead of failing every record:

- ``schema.file`` with ``autoRegister: false`` (the default): the schema must already be
  registered under the subject;
- ``schema.file`` with ``autoRegister: true``: it is registered (the registry's compatibility
  check may refuse it: the refusal is the error);
- ``schema.subject`` alone: the subject's latest version is what values are encoded with.

After that each value is encoded with the resolved schema and id, with no registry round trip.
A value that does not fit the schema fails that record only (errors.policy, stage sink).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import SerializationContext

from offtake.config.spec import KafkaSinkSpec
from offtake.errors import OfftakeError
from offtake.formats.avro import AvroEncoder
from offtake.formats.base import Encoder
from offtake.formats.jsonschema import JsonSchemaEncoder
from offtake.formats.protobuf import ProtobufEncoder, message_class, payload_start
from offtake.formats.wire import context, needs_serde
from offtake.redact import redact

_SCHEMA_TYPES = {"avro": "AVRO", "jsonschema": "JSON", "protobuf": "PROTOBUF"}


class SinkSchemaError(OfftakeError, ValueError):
    """The sink's schema cannot be used (not registered, incompatible, unreadable)."""


class SerdeEncoder(Encoder):
    """confluent-kafka's own serializer: for a schema that uses what only it implements
    (references, rule sets, inline rules; see offtake.formats.wire)."""

    def __init__(self, fmt: str, serialize: Callable[[Any, SerializationContext], Any], topic: str):
        self.format = fmt
        self._serialize = serialize
        self._ctx = context(topic)

    def encode(self, value: Any) -> bytes | None:
        data = self._serialize(value, self._ctx)
        return None if data is None else bytes(data)


def schema_encoder(spec: KafkaSinkSpec, client: SchemaRegistryClient) -> Encoder:
    """The encoder of the sink's topic; raises SinkSchemaError now if the schema cannot be
    resolved."""
    subject = (spec.schema.subject if spec.schema else None) or f"{spec.topic}-value"
    conf: dict[str, Any] = {
        "auto.register.schemas": spec.auto_register,
        "subject.name.strategy": lambda _ctx, _name: subject,
    }
    if spec.format == "protobuf":
        return _protobuf(spec, client, conf, subject)
    schema, schema_id = _resolve(spec, client, subject)
    if not needs_serde(schema):
        text = schema.schema_str or ""
        if spec.format == "avro":
            return AvroEncoder(text, schema_id)
        return JsonSchemaEncoder(text, schema_id)
    if _file(spec) is None:
        conf["use.latest.version"] = True
    if spec.format == "avro":
        from confluent_kafka.schema_registry.avro import AvroSerializer

        avro = AvroSerializer(client, schema.schema_str, conf=conf)
        return SerdeEncoder("avro", avro, spec.topic)
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    js = JSONSerializer(schema.schema_str, client, conf=conf)
    return SerdeEncoder("jsonschema", js, spec.topic)


def _file(spec: KafkaSinkSpec) -> str | None:
    return spec.schema.file if spec.schema is not None else None


def _resolve(spec: KafkaSinkSpec, client: SchemaRegistryClient, subject: str) -> tuple[Schema, int]:
    """The schema to encode with and its id, checked against the registry as the spec says."""
    where = f"spec.sink.kafka (subject {subject!r})"
    file = _file(spec)
    try:
        if file is None:
            latest = client.get_latest_version(subject)
            return latest.schema, _id(latest.schema_id)
        try:
            text = Path(file).read_text(encoding="utf-8")
        except OSError as exc:
            raise SinkSchemaError(
                f"spec.sink.kafka.schema.file: cannot read {file}: {exc.strerror or exc}"
            ) from None
        schema = Schema(text, _SCHEMA_TYPES[spec.format])
        if spec.auto_register:
            return schema, int(client.register_schema(subject, schema))
        return schema, _id(client.lookup_schema(subject, schema).schema_id)
    except SchemaRegistryError as exc:
        raise SinkSchemaError(f"{where}: {_explain(exc, spec)}") from None
    except SinkSchemaError:
        raise
    except Exception as exc:  # the registry could not be reached
        raise SinkSchemaError(
            f"{where}: the schema registry at {client_url(spec)} did not answer: {exc}"
        ) from None


def _id(schema_id: int | None) -> int:
    assert schema_id is not None, "a registered schema has an id"
    return schema_id


def _explain(exc: SchemaRegistryError, spec: KafkaSinkSpec) -> str:
    status, code = exc.http_status_code, exc.error_code
    file = _file(spec)
    if status == 409:
        return f"the registry refused the schema in {file} as incompatible: {exc.error_message}"
    if status == 404 and file is not None:
        return (
            f"the schema in {file} is not registered under this subject and "
            "autoRegister is false: register it, or set spec.sink.kafka.autoRegister: true "
            f"({exc.error_message})"
        )
    if status == 404:
        return f"the subject has no registered schema ({exc.error_message})"
    return f"the schema registry answered {status} (code {code}): {exc.error_message}"


def _protobuf(
    spec: KafkaSinkSpec, client: SchemaRegistryClient, conf: dict[str, Any], subject: str
) -> Encoder:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    assert spec.protobuf_message is not None, "the loader requires sink.kafka.protobufMessage"
    try:
        cls = message_class(spec.protobuf_message)
    except ValueError as exc:
        raise SinkSchemaError(f"spec.sink.kafka.protobufMessage: {exc}") from None
    conf = {**conf, "use.deprecated.format": False}
    if not spec.auto_register:
        conf["use.latest.version"] = True
    pb = ProtobufSerializer(cls, client, conf)
    where = f"spec.sink.kafka (subject {subject!r})"
    try:  # resolve (or register) the schema now: an empty message is a valid one
        empty = bytes(pb(cls(), context(spec.topic)))
        schema = client.get_schema(int.from_bytes(empty[1:5], "big"), fmt="serialized")
    except SchemaRegistryError as exc:
        raise SinkSchemaError(f"{where}: {_explain(exc, spec)}") from None
    except Exception as exc:
        raise SinkSchemaError(
            f"{where}: the schema registry at {client_url(spec)} did not answer: {exc}"
        ) from None
    if schema.rule_set:  # the serializer runs the subject's rules: only it
        return SerdeEncoder("protobuf", _from_dict(pb, cls), spec.topic)
    # The serializer's header and message index for this class, written before each message.
    return ProtobufEncoder(cls, empty[: payload_start(empty)])


def _from_dict(pb: Callable[[Any, SerializationContext], Any], cls: Any) -> Callable[..., Any]:
    from google.protobuf.json_format import ParseDict

    def serialize(value: Any, ctx: SerializationContext) -> Any:
        return None if value is None else pb(ParseDict(value, cls()), ctx)

    return serialize


def client_url(spec: KafkaSinkSpec) -> str:
    return redact(spec.schema_registry.url) if spec.schema_registry is not None else "(none)"
