"""The Kafka sink's values with a schema: avro | protobuf | jsonschema in the schema registry
wire format, with confluent-kafka's own serializers (so JSON in, Avro out, and back).

The schema is resolved when the worker starts, so that a missing or incompatible schema stops
the worker with a message that says which and why, instead of failing every record:

- ``schema.file`` with ``autoRegister: false`` (the default): the schema must already be
  registered under the subject;
- ``schema.file`` with ``autoRegister: true``: it is registered (the registry's compatibility
  check may refuse it: the refusal is the error);
- ``schema.subject`` alone: the subject's latest version is what values are encoded with.

After that each record is encoded with the cached schema id, with no registry round trip. A
value that does not fit the schema fails that record only (errors.policy, stage sink).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from offtake.config.spec import KafkaSinkSpec
from offtake.redact import redact
from offtake.schema_registry import load_message_class, make_client

_SCHEMA_TYPES = {"avro": "AVRO", "jsonschema": "JSON", "protobuf": "PROTOBUF"}


class SinkSchemaError(ValueError):
    """The sink's schema cannot be used (not registered, incompatible, unreadable)."""


Encoder = Callable[[Any], "bytes | None"]


def schema_encoder(spec: KafkaSinkSpec, client: SchemaRegistryClient | None = None) -> Encoder:
    """A value -> wire-format bytes function for the sink's topic; raises SinkSchemaError now
    if the schema cannot be resolved. ``client``: instead of one for the spec's registry."""
    fmt, topic = spec.format, spec.topic
    if client is None:
        assert spec.schema_registry is not None, "the loader requires a registry for it"
        client = make_client(spec.schema_registry)
    subject = (spec.schema.subject if spec.schema else None) or f"{topic}-value"
    ctx = SerializationContext(topic, MessageField.VALUE)
    conf: dict[str, Any] = {
        "auto.register.schemas": spec.auto_register,
        "subject.name.strategy": lambda _ctx, _name: subject,
    }
    if fmt == "protobuf":
        return _protobuf(spec, client, conf, ctx, subject)
    schema = _resolve(fmt, spec, client, subject)
    if _file(spec) is None:
        conf["use.latest.version"] = True
    if fmt == "avro":
        from confluent_kafka.schema_registry.avro import AvroSerializer

        avro = AvroSerializer(client, schema, conf=conf)
        return lambda value: _none_or_bytes(avro(value, ctx))
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    js = JSONSerializer(schema, client, conf=conf)
    return lambda value: _none_or_bytes(js(value, ctx))


def _file(spec: KafkaSinkSpec) -> str | None:
    return spec.schema.file if spec.schema is not None else None


def _resolve(fmt: str, spec: KafkaSinkSpec, client: SchemaRegistryClient, subject: str) -> str:
    """The schema text to encode with, checked against the registry as the spec says."""
    where = f"spec.sink.kafka (subject {subject!r})"
    file = _file(spec)
    try:
        if file is None:
            return str(client.get_latest_version(subject).schema.schema_str)
        try:
            text = Path(file).read_text(encoding="utf-8")
        except OSError as exc:
            raise SinkSchemaError(
                f"spec.sink.kafka.schema.file: cannot read {file}: {exc.strerror or exc}"
            ) from None
        schema = Schema(text, _SCHEMA_TYPES[fmt])
        if spec.auto_register:
            client.register_schema(subject, schema)
        else:
            client.lookup_schema(subject, schema)
        return text
    except SchemaRegistryError as exc:
        raise SinkSchemaError(f"{where}: {_explain(exc, spec)}") from None
    except SinkSchemaError:
        raise
    except Exception as exc:  # the registry could not be reached
        raise SinkSchemaError(
            f"{where}: the schema registry at {client_url(spec)} did not answer: {exc}"
        ) from None


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
    spec: KafkaSinkSpec,
    client: SchemaRegistryClient,
    conf: dict[str, Any],
    ctx: SerializationContext,
    subject: str,
) -> Encoder:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from google.protobuf.json_format import ParseDict

    assert spec.protobuf_message is not None, "the loader requires sink.kafka.protobufMessage"
    try:
        cls = load_message_class(spec.protobuf_message)
    except ValueError as exc:
        raise SinkSchemaError(f"spec.sink.kafka.protobufMessage: {exc}") from None
    conf = {**conf, "use.deprecated.format": False}
    if not spec.auto_register:
        conf["use.latest.version"] = True
    pb = ProtobufSerializer(cls, client, conf)
    try:  # resolve (or register) the schema now: an empty message is a valid one
        pb(cls(), ctx)
    except SchemaRegistryError as exc:
        message = _explain(exc, spec)
        raise SinkSchemaError(f"spec.sink.kafka (subject {subject!r}): {message}") from None
    except Exception as exc:
        raise SinkSchemaError(
            f"spec.sink.kafka (subject {subject!r}): the schema registry at "
            f"{client_url(spec)} did not answer: {exc}"
        ) from None

    def encode(value: Any) -> bytes | None:
        if value is None:
            return None
        return _none_or_bytes(pb(ParseDict(value, cls()), ctx))

    return encode


def client_url(spec: KafkaSinkSpec) -> str:
    return redact(spec.schema_registry.url) if spec.schema_registry is not None else "(none)"


def _none_or_bytes(data: bytes | None) -> bytes | None:
    return None if data is None else bytes(data)
