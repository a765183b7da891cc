"""Records as the memory broker stores them and as its clients hand them out.

Owns :class:`Entry` (a stored record), :class:`MemoryMessage` (the ``confluent_kafka.Message``
look-alike) and the conversions of keys, values and headers confluent-kafka accepts. Values
only, no shared state, no locking: a :class:`MemoryMessage` belongs to whoever received it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_INVALID, TIMESTAMP_CREATE_TIME, KafkaError, TopicPartition

TP = tuple[str, int]
Header = tuple[str, bytes | None]
RebalanceCallback = Callable[[Any, list[Any]], None]
DeliveryCallback = Callable[[Any, Any], None]


class Entry(NamedTuple):
    """One record as the broker stores it."""

    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] | None
    timestamp: int


class MemoryMessage:
    """A record or an event, with the accessors of ``confluent_kafka.Message``."""

    __slots__ = (
        "_delivery_count",
        "_error",
        "_headers",
        "_key",
        "_offset",
        "_partition",
        "_timestamp",
        "_topic",
        "_value",
    )

    def __init__(
        self,
        topic: str | None,
        partition: int | None,
        offset: int | None,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: Sequence[Header] | None = None,
        timestamp: int | None = None,
        error: KafkaError | None = None,
        delivery_count: int | None = None,
    ) -> None:
        self._delivery_count = delivery_count
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key = key
        self._value = value
        self._headers = list(headers) if headers else None
        self._timestamp = timestamp
        self._error = error

    def error(self) -> KafkaError | None:
        return self._error

    def delivery_count(self) -> int | None:
        """A share group's delivery count (1 the first time); None from a consumer group."""
        return self._delivery_count

    def topic(self) -> str | None:
        return self._topic

    def partition(self) -> int | None:
        return self._partition

    def offset(self) -> int | None:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[Header] | None:
        # A copy, like confluent-kafka, so callers cannot edit the stored record.
        return list(self._headers) if self._headers is not None else None

    def timestamp(self) -> tuple[int, int]:
        if self._timestamp is None:
            return (0, 0)  # TIMESTAMP_NOT_AVAILABLE
        return (TIMESTAMP_CREATE_TIME, self._timestamp)

    def latency(self) -> float | None:
        return None

    def leader_epoch(self) -> int | None:
        return None

    def set_key(self, key: bytes | None) -> None:
        self._key = key

    def set_value(self, value: bytes | None) -> None:
        self._value = value

    def set_headers(self, headers: Sequence[Header] | None) -> None:
        self._headers = list(headers) if headers else None

    def __len__(self) -> int:
        return len(self._value or b"")

    def __repr__(self) -> str:
        where = f"{self._topic}[{self._partition}]@{self._offset}"
        if self._error is not None:
            return f"MemoryMessage({where}, error={self._error})"
        return f"MemoryMessage({where}, key={self._key!r}, value={self._value!r})"


def message_of(topic: str, partition: int, offset: int, entry: Entry) -> MemoryMessage:
    """The message a consumer receives for a stored record."""
    return MemoryMessage(
        topic, partition, offset, entry.key, entry.value, entry.headers, entry.timestamp
    )


def error_message(
    error: KafkaError,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
) -> MemoryMessage:
    """An event a consumer returns instead of a record (EOF, max.poll exceeded, fenced...)."""
    return MemoryMessage(topic, partition, offset, error=error)


def to_bytes(value: Any, what: str) -> bytes | None:
    """bytes as they are, str as UTF-8, like confluent-kafka; anything else is a TypeError."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"{what} must be bytes, str or None, got {type(value).__name__}")


def encode_any(value: Any) -> bytes | None:
    """For the admin helper only: also accepts dicts, lists and numbers, as compact JSON."""
    if value is None or isinstance(value, bytes | bytearray | memoryview | str):
        return to_bytes(value, "value")
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def normalise_headers(headers: Any) -> tuple[Header, ...] | None:
    """A dict or a list of (name, value) pairs, as confluent-kafka accepts them."""
    if not headers:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: list[Header] = []
    for item in items:
        name, value = item
        if not isinstance(name, str):
            raise TypeError(f"header names must be str, got {type(name).__name__}")
        out.append((name, to_bytes(value, f"header {name!r}")))
    return tuple(out)


def tp_name(tp: TP) -> str:
    return f"{tp[0]}[{tp[1]}]"


def topic_partitions(parts: Iterable[TP]) -> list[Any]:
    """confluent-kafka TopicPartitions, sorted, with no offset."""
    return [TopicPartition(t, p, OFFSET_INVALID) for t, p in sorted(parts)]
