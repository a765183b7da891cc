"""Turn a consumed Kafka message into a :class:`Record`, decoding its value per source.format.

json, string and bytes are decoded here; the formats with a schema (avro, protobuf,
jsonschema) by a :class:`ValueDecoder` (:mod:`offtake.processing.schema_formats`), one per
format, built once per worker by :func:`make_decoder`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from offtake.kafka.protocols import MessageLike
from offtake.records import Record, make_record

if TYPE_CHECKING:
    from offtake.config.spec import SourceSpec


class DecodeError(ValueError):
    """A record's value is not valid for ``source.format``; names the record."""


class ValueDecoder(Protocol):
    """Decodes the (non-null) value bytes of a record of ``topic``; raises DecodeError."""

    def decode(self, raw: bytes, topic: str) -> Any: ...


def make_decoder(source: SourceSpec, registry: Any = None) -> str | ValueDecoder:
    """What :func:`to_record` decodes with: the format's name, or a schema format's decoder.

    ``registry``: a SchemaRegistryClient to use instead of one for source.schemaRegistry (the
    test kit passes confluent-kafka's in-memory one).
    """
    if source.format in ("json", "string", "bytes"):
        return source.format
    from offtake.processing.schema_formats import SchemaValueDecoder
    from offtake.schema_registry import make_client

    if registry is None:
        assert source.schema_registry is not None, "the loader requires it for this format"
        registry = make_client(source.schema_registry)
    return SchemaValueDecoder(source.format, registry, source.protobuf_message)


def to_record(msg: MessageLike, fmt: str | ValueDecoder) -> tuple[Record, DecodeError | None]:
    """The record with its value decoded, or (with value None) and the reason it could not be.

    A decode failure is returned, not raised: the record still exists and must reach the error
    policy (its raw bytes go to the dead-letter topic), it just has no usable value.
    """
    raw = msg.value()
    topic, partition, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
    ts_type, ts = msg.timestamp()
    value: Any = None
    error: DecodeError | None = None
    try:
        if isinstance(fmt, str):
            value = decode_value(raw, fmt)
        elif raw is not None:  # a null value (a tombstone) has no schema: it stays None
            value = fmt.decode(raw, topic)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        where = f"{topic}[{partition}]@{offset}"
        error = DecodeError(f"record {where}: value is not valid {fmt}: {exc}")
    except DecodeError as exc:  # a schema format's; it keeps its type (and headers)
        exc.args = (f"record {topic}[{partition}]@{offset}: {exc}",)
        error = exc
    headers = msg.headers()
    record = make_record(
        topic,
        partition,
        offset,
        msg.key(),
        value,
        tuple(headers) if headers else (),
        ts if ts_type != 0 and ts >= 0 else None,
        raw,
    )
    return record, error


def to_records(
    messages: list[MessageLike], topic: str, partition: int, fmt: str
) -> list[tuple[Record, DecodeError | None]]:
    """:func:`to_record` for one poll's messages of one partition, json, string or bytes.

    One pass with the per-record work inlined (no function call per record for the value):
    this is where a JSON pipeline spends much of its time per record.
    """
    out: list[tuple[Record, DecodeError | None]] = []
    append = out.append
    loads = orjson.loads if fmt == "json" else None
    for msg in messages:
        raw = msg.value()
        value: Any = raw
        if raw is not None and fmt != "bytes":
            try:
                value = loads(raw) if loads is not None else raw.decode("utf-8")
            except (UnicodeDecodeError, orjson.JSONDecodeError):
                append(to_record(msg, fmt))  # the standard library's reading, or its error
                continue
        ts_type, ts = msg.timestamp()
        headers = msg.headers()
        record = make_record(
            topic,
            partition,
            msg.offset() or 0,
            msg.key(),
            value,
            tuple(headers) if headers else (),
            ts if ts_type != 0 and ts >= 0 else None,
            raw,
        )
        append((record, None))
    return out


def decode_value(raw: bytes | None, fmt: str) -> Any:
    if raw is None or fmt == "bytes":
        return raw
    if fmt == "json":
        try:
            return orjson.loads(raw)  # the fast path: about 7x the standard library's speed
        except orjson.JSONDecodeError:
            pass  # an int beyond 64 bits, NaN: the standard library reads them, or says why not
    text = raw.decode("utf-8")
    return json.loads(text) if fmt == "json" else text
