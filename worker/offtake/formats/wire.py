"""The schema registry wire format, and what the schema'd decoders share.

A value is a magic byte 0, the writer's schema id (4 bytes, big-endian) and the encoded data
(protobuf: first the message index, zigzag varints). A :class:`SchemaDecoder` asks the
registry for a schema id once, keeps a reader for it (the parsed writer schema, the message
class, the compiled validator) and reads every later value of that id with no registry
round trip and none of the serializer framework's per-call work.

A schema that uses what only confluent-kafka's own deserializer implements (references to
other schemas, a rule set, inline ``confluent:`` rules or tags) is read by that deserializer,
for that schema id only, so nothing a registry can express is read differently.

A 401/403 for a schema id is judged by asking the registry for its subject listing
(schema_registry.answers_listing): answered, only that id is refused (the record's decode
error, reason ``schema-id-refused``, remembered for REFUSED_FOR_S); refused as well, the
registry refuses the pipeline's credentials and so every id: RegistryUnavailable (records
wait, as for an unreachable registry or a 5xx).
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Callable
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext

from offtake.errors import OfftakeError
from offtake.formats.base import Decoder
from offtake.formats.errors import (
    NOT_WIRE_FORMAT,
    OUT_OF_BOUNDS,
    SCHEMA_MISMATCH,
    SCHEMA_REFUSED,
    UNKNOWN_SCHEMA,
    DecodeError,
    OutOfBounds,
    RegistryUnavailable,
    SchemaDecodeError,
)
from offtake.schema_registry import answers_listing, is_outage, is_refusal

MAGIC_BYTE = 0
HEADER_SIZE = 5
Reader = Callable[[bytes, str], Any]  # a whole wire-format value and its topic -> the value
#: How long a schema id the registry refused is refused without asking again: the records of
#: one refused id fail at once instead of costing two registry requests each.
REFUSED_FOR_S = 60.0
#: At most this many refused ids are remembered (a producer may name a new id per record).
REFUSED_KEPT = 1024


def wire_schema_id(raw: bytes) -> int:
    """The schema id of a wire-format value; SchemaDecodeError if it is not one."""
    if len(raw) < HEADER_SIZE or raw[0] != MAGIC_BYTE:
        first = f"0x{raw[0]:02x}" if raw else "nothing"
        raise SchemaDecodeError(
            f"value is not in the schema registry wire format (magic byte 0 and a 4-byte schema "
            f"id): {len(raw)} byte(s), first byte {first}",
            None,
            NOT_WIRE_FORMAT,
        )
    return int.from_bytes(raw[1:HEADER_SIZE], "big")


def header(schema_id: int) -> bytes:
    return bytes((MAGIC_BYTE,)) + schema_id.to_bytes(4, "big")


def needs_serde(schema: Schema) -> bool:
    """Whether a schema uses what only confluent-kafka's serializers implement."""
    return bool(schema.references or schema.rule_set or "confluent:" in (schema.schema_str or ""))


def context(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


def refused_error(
    client: SchemaRegistryClient, schema_id: int, exc: Exception
) -> SchemaDecodeError:
    """The registry answered 401/403 (``exc``) for ``schema_id``: the record's error (reason
    SCHEMA_REFUSED, naming the id and the registry's answer) if the registry still answers the
    subject listing (schema_registry.answers_listing: only this id is refused), else
    RegistryUnavailable is raised (it refuses every id: the credentials, or it is down).
    The one rule for every reader of schema ids: the decoders and the Spark sink's columns."""
    try:
        only_this_id = answers_listing(client)
    except Exception as probe:
        raise RegistryUnavailable(f"schema registry: {exc}; then: {probe}") from exc
    if not only_this_id:
        raise RegistryUnavailable(
            f"schema registry refuses this pipeline's credentials (schema id {schema_id} "
            f"and the subject listing): {exc}"
        ) from exc
    return SchemaDecodeError(
        f"schema id {schema_id} is refused by the schema registry (it answers this "
        f"pipeline's other requests): {exc}",
        schema_id,
        SCHEMA_REFUSED,
    )


class _NotKnown(OfftakeError):
    """Not for the fast path: read carefully."""


class SchemaDecoder(Decoder):
    """A schema'd format's decoder: wire framing, one registry lookup per schema id."""

    def __init__(self, client: SchemaRegistryClient) -> None:
        self._client = client
        # Keyed by a value's whole header (the magic byte and the schema id): the fast path
        # finds a known writer schema's reader with one slice and one lookup.
        self._readers: dict[bytes, Reader] = {}
        self._serde: Reader | None = None
        # Schema id -> (when the refusal is forgotten, its error): see _refused_error.
        self._refused: dict[int, tuple[float, SchemaDecodeError]] = {}

    def value(self, raw: bytes, topic: str) -> Any:
        schema_id = wire_schema_id(raw)
        try:
            read = self._readers.get(raw[:HEADER_SIZE])
            if read is None:
                read = self._reader(schema_id)
            return read(raw, topic)
        except (DecodeError, RegistryUnavailable):
            raise
        except OutOfBounds as exc:
            raise SchemaDecodeError(
                f"value of schema id {schema_id} is refused: {exc}", schema_id, OUT_OF_BOUNDS
            ) from None
        except Exception as exc:
            # A lookup confluent-kafka's deserializer made itself (a referenced schema).
            if is_refusal(exc):
                raise self._refused_error(schema_id, exc) from None
            if is_outage(exc):
                raise RegistryUnavailable(f"schema registry: {exc}") from exc
            raise SchemaDecodeError(
                f"value does not decode as {self.format} with schema id {schema_id}: "
                f"{type(exc).__name__}: {exc}",
                schema_id,
                SCHEMA_MISMATCH,
            ) from None

    def fast(self, topic: str) -> tuple[Callable[[bytes], Any], tuple[type[Exception], ...]]:
        # A known schema id's reader, called directly; anything else (a new id, bytes outside
        # the wire format, a value its reader refuses) is value()'s to fetch, sort and explain.
        readers = self._readers

        def read(raw: bytes) -> Any:
            reader = readers.get(raw[:HEADER_SIZE])
            if reader is not None:
                return reader(raw, topic)
            raise _NotKnown

        return read, (Exception,)

    def _reader(self, schema_id: int) -> Reader:
        known = self._refused.get(schema_id)
        if known is not None and known[0] > time.monotonic():
            raise SchemaDecodeError(str(known[1]), schema_id, SCHEMA_REFUSED)
        try:
            schema = self._fetch(schema_id)
        except Exception as exc:
            if is_refusal(exc):
                raise self._refused_error(schema_id, exc) from None
            if is_outage(exc):
                raise RegistryUnavailable(f"schema registry: {exc}") from exc
            raise SchemaDecodeError(
                f"schema id {schema_id} is not known to the schema registry: {exc}",
                schema_id,
                UNKNOWN_SCHEMA,
            ) from None
        # A schema that does not parse fails this record (not cached: tried again).
        read = self._serde_reader() if self.needs_serde(schema) else self.reader(schema)
        self._readers[header(schema_id)] = read
        return read

    def _fetch(self, schema_id: int) -> Schema:
        return self._client.get_schema(schema_id)

    def _refused_error(self, schema_id: int, exc: Exception) -> SchemaDecodeError:
        """:func:`refused_error`, remembered for REFUSED_FOR_S."""
        error = refused_error(self._client, schema_id, exc)
        now = time.monotonic()
        if len(self._refused) >= REFUSED_KEPT:
            self._refused = {k: v for k, v in self._refused.items() if v[0] > now}
            if len(self._refused) >= REFUSED_KEPT:
                self._refused.clear()  # forgotten ones are asked about again, nothing more
        self._refused[schema_id] = (now + REFUSED_FOR_S, error)
        return error

    def needs_serde(self, schema: Schema) -> bool:
        return needs_serde(schema)

    def _serde_reader(self) -> Reader:
        if self._serde is None:
            deserialize = self.serde()
            self._serde = lambda raw, topic: deserialize(raw, context(topic))
        return self._serde

    @abstractmethod
    def reader(self, schema: Schema) -> Reader:
        """The fast reader of values written with ``schema``."""

    @abstractmethod
    def serde(self) -> Callable[[bytes, SerializationContext], Any]:
        """confluent-kafka's deserializer for this format (values as the fast reader's)."""
