"""Turn a consumed Kafka message into a :class:`Record`, decoding its value per source.format."""

from __future__ import annotations

import json
from typing import Any

from offtake.kafka.protocols import MessageLike
from offtake.records import Record


class DecodeError(ValueError):
    """A record's value is not valid for ``source.format``; names the record."""


def to_record(msg: MessageLike, fmt: str) -> tuple[Record, DecodeError | None]:
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
        value = decode_value(raw, fmt)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        where = f"{topic}[{partition}]@{offset}"
        error = DecodeError(f"record {where}: value is not valid {fmt}: {exc}")
    record = Record(
        topic=topic,
        partition=partition,
        offset=offset,
        key=msg.key(),
        value=value,
        headers=tuple(msg.headers() or ()),
        timestamp=ts if ts_type != 0 and ts >= 0 else None,
        raw_value=raw,
    )
    return record, error


def decode_value(raw: bytes | None, fmt: str) -> Any:
    if raw is None or fmt == "bytes":
        return raw
    text = raw.decode("utf-8")
    return json.loads(text) if fmt == "json" else text
