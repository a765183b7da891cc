"""The two contracts of a format, and the batch decode loop every decoder shares.

A :class:`Decoder` is built once per pipeline (Quix Streams' ``_resolve_deserializer`` is the
model): whatever a format needs (a registry client, parsed schemas, compiled validators) it
holds and caches, so nothing is looked up per record but the schema id of a new writer schema.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from offtake.formats.errors import DecodeError
from offtake.kafka.protocols import MessageLike
from offtake.records import Record, make_record

Decoded = tuple[Record, DecodeError | None]


class Decoder(ABC):
    """Turns a consumed message into a :class:`Record` with its value decoded."""

    format: str

    @abstractmethod
    def value(self, raw: bytes, topic: str) -> Any:
        """The value of a (non-null) value's bytes read from ``topic``, carefully: raises
        DecodeError for bytes that are not valid, RegistryUnavailable while the registry is
        unreachable."""

    @abstractmethod
    def fast(self, topic: str) -> tuple[Callable[[bytes], Any], tuple[type[Exception], ...]]:
        """The per-record function of the batch path for ``topic``, and the exceptions after
        which :meth:`value` reads the record again (to say why, or to read what only the
        careful path reads)."""

    def records(self, messages: Sequence[MessageLike], topic: str, partition: int) -> list[Decoded]:
        """One poll's messages of one partition, decoded in one pass.

        A decode failure is returned with its record (value None), not raised: the record
        still exists and must reach the error policy (its raw bytes go to the dead-letter
        topic). RegistryUnavailable is raised: the caller waits and decodes the batch again.
        """
        out: list[Decoded] = []
        append = out.append
        fast, slow_after = self.fast(topic)
        for msg in messages:
            raw = msg.value()
            value: Any = None
            error: DecodeError | None = None
            if raw is not None:  # a null value (a tombstone) has no format: it stays None
                try:
                    value = fast(raw)
                except slow_after:
                    try:
                        value = self.value(raw, topic)
                    except DecodeError as exc:  # keeps its type (and a schema error's headers)
                        exc.args = (f"record {topic}[{partition}]@{msg.offset() or 0}: {exc}",)
                        error = exc
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
            append((record, error))
        return out

    def record(self, msg: MessageLike) -> Decoded:
        """:meth:`records` for one message."""
        return self.records([msg], msg.topic() or "", msg.partition() or 0)[0]


class Encoder(ABC):
    """Turns processed values into the bytes the Kafka sink writes (None: a tombstone)."""

    format: str

    @abstractmethod
    def encode(self, value: Any) -> bytes | None:
        """The value's bytes; raises (UnsendableValueError, a schema mismatch) for a value that
        has none: that record fails, not its neighbours."""

    def encode_many(self, values: Sequence[Any]) -> tuple[list[bytes | None], dict[int, Exception]]:
        """Each value's bytes (None where it failed), and the failures by position."""
        encode = self.encode
        out: list[bytes | None] = []
        failed: dict[int, Exception] = {}
        for i, value in enumerate(values):
            try:
                out.append(encode(value))
            except Exception as exc:  # this value's alone (the error policy, stage sink)
                out.append(None)
                failed[i] = exc
        return out, failed
