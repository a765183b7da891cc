"""The pipeline's decoder and encoder, chosen once from the spec (Quix Streams'
``_resolve_deserializer`` is the model); callers hold the object, never the format's name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from offtake.formats.base import Decoder, Encoder
from offtake.formats.plain import BytesDecoder, JsonDecoder, JsonEncoder, StringDecoder

if TYPE_CHECKING:
    from offtake.config.spec import KafkaSinkSpec, SchemaRegistrySpec, SourceSpec

PLAIN_DECODERS: dict[str, type[Decoder]] = {
    "json": JsonDecoder,
    "string": StringDecoder,
    "bytes": BytesDecoder,
}


def decoder_for(source: SourceSpec, registry: Any = None) -> Decoder:
    """``source.format``'s decoder. ``registry``: a SchemaRegistryClient to use instead of one
    for source.schemaRegistry (the test kit passes confluent-kafka's in-memory one)."""
    plain = PLAIN_DECODERS.get(source.format)
    if plain is not None:
        return plain()
    return schema_decoder(
        source.format, registry or _client(source.schema_registry), source.protobuf_message
    )


def schema_decoder(fmt: str, client: Any, protobuf_message: Any = None) -> Decoder:
    """A schema'd format's decoder on ``client``; ``protobuf_message``: the generated class,
    or its ``module:Class`` path."""
    if fmt == "avro":
        from offtake.formats.avro import AvroDecoder

        return AvroDecoder(client)
    if fmt == "jsonschema":
        from offtake.formats.jsonschema import JsonSchemaDecoder

        return JsonSchemaDecoder(client)
    if fmt == "protobuf":
        from offtake.formats.protobuf import ProtobufDecoder

        return ProtobufDecoder(client, protobuf_message)
    raise ValueError(f"not a schema format: {fmt}")


def encoder_for(kafka: KafkaSinkSpec, registry: Any = None) -> Encoder:
    """``sink.kafka.format``'s encoder; a schema'd one resolves its schema now (SinkSchemaError)."""
    if kafka.format == "json":
        return JsonEncoder()
    from offtake.formats.sink_schema import schema_encoder

    return schema_encoder(kafka, registry or _client(kafka.schema_registry))


def _client(spec: SchemaRegistrySpec | None) -> Any:
    assert spec is not None, "the loader requires a schema registry for this format"
    # Imported here: confluent-kafka's registry client brings authlib, httpx and joserfc,
    # about a second of every worker's start, which plain formats never use.
    from offtake.schema_registry import make_client

    return make_client(spec)
