"""The dead-letter topic: failed records, byte for byte, with headers saying what happened."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from offtake.engine.header_values import (
    HeaderError,
    HeaderList,
    last,
    read_int,
    read_partition,
    read_topic,
)

# A schema decode error's headers (the schema id and the reason), named where it is raised.
from offtake.formats.errors import H_REASON, H_SCHEMA_ID
from offtake.kafka.produce import produce_waiting
from offtake.kafka.protocols import ProducerLike
from offtake.records import Record
from offtake.redact import redact

# Header names are part of the contract with users' DLQ tooling (docs/worker.md, dead letters).
H_TOPIC = "offtake.original.topic"
H_PARTITION = "offtake.original.partition"
H_OFFSET = "offtake.original.offset"
H_TIMESTAMP = "offtake.original.timestamp"
H_ERROR_CLASS = "offtake.error.class"
H_ERROR_MESSAGE = "offtake.error.message"
H_ATTEMPTS = "offtake.attempts"
H_STAGE = "offtake.error.stage"


def describe_error(error: BaseException) -> str:
    """The error as users need it: ``KeyError: 'amount'``, not ``'amount'``.

    Offtake's own errors already say what they are (and name the record), so they stay as is.
    Either way credentials are masked: a client's error may quote the URL it was given
    (``user:pass@``, ``;password=``), and this text goes into a dead letter's headers, which
    whoever may read the DLQ topic reads.
    """
    if type(error).__module__.startswith("offtake."):
        return redact(str(error))
    return redact(f"{type(error).__name__}: {error}")


H_RETRY_DUE = "offtake.retry.due"  # on retry topics: when to process it, ms since the epoch
H_RETRY_TOPIC = "offtake.retry.topic"  # on retry topics: the retry topic it was sent to
_ORIGIN = (H_TOPIC, H_PARTITION, H_OFFSET, H_TIMESTAMP)
_OURS = frozenset(
    {
        *_ORIGIN,
        H_ERROR_CLASS,
        H_ERROR_MESSAGE,
        H_ATTEMPTS,
        H_STAGE,
        H_RETRY_DUE,
        H_RETRY_TOPIC,
        H_SCHEMA_ID,
        H_REASON,
    }
)
#: Offtake's own headers all start with this.
OFFTAKE_PREFIX = "offtake."
#: Set by ``offtake redrive`` on the records it replays into a source topic; a replayed record
#: that fails again keeps them (the redrive recognises its own records by them).
REDRIVE_PREFIX = "offtake.redrive."
#: A producer's own ``offtake.*`` headers, moved aside on a dead letter or retry record:
#: ``offtake.original.topic`` becomes ``producer.offtake.original.topic``. Kept, never read.
PRODUCER_PREFIX = "producer."


@dataclass(frozen=True)
class Origin:
    """Where a dead letter first came from, read strictly from its ``offtake.original.*``."""

    topic: str
    partition: int | None
    offset: int | None
    timestamp: int | None


def read_origin(headers: HeaderList | None) -> Origin | None:
    """The record's origin (None without ``offtake.original.topic``).

    Raises :class:`~offtake.engine.header_values.HeaderError` naming the header when a value is
    not what Offtake writes there. Each value is the header's last copy: Offtake's (see
    :func:`dlq_headers`, which appends its own after what it carries over).
    """
    topic = read_topic(headers, H_TOPIC)
    if topic is None:
        return None
    return Origin(
        topic,
        read_partition(headers, H_PARTITION),
        read_int(headers, H_OFFSET),
        read_int(headers, H_TIMESTAMP),
    )


def _carried(record: Record, retried: bool) -> tuple[list[tuple[str, bytes | None]], Origin]:
    """The record's headers to keep (a producer's ``offtake.*`` moved aside) and its origin.

    On a source topic every ``offtake.*`` header is the producer's, except the last copy of each
    ``offtake.redrive.*`` (a replayed record's). On a retry topic Offtake's headers are from the
    earlier hop: the origin is carried forward if it reads strictly, else (a record someone
    wrote to the retry topic by hand) the record's own coordinates stand; the rest of Offtake's
    are replaced below.
    """
    here = Origin(record.topic, record.partition, record.offset, record.timestamp)
    origin = here
    if retried:
        try:
            origin = read_origin(record.headers) or here
        except HeaderError:
            origin = here
    last_redrive = {
        k: i for i, (k, _v) in enumerate(record.headers) if k.startswith(REDRIVE_PREFIX)
    }
    kept: list[tuple[str, bytes | None]] = []
    for i, (k, v) in enumerate(record.headers):
        if not k.startswith(OFFTAKE_PREFIX) or last_redrive.get(k) == i:
            kept.append((k, v))
        elif not (retried and k in _OURS):
            kept.append((PRODUCER_PREFIX + k, v))
    return kept, origin


def dlq_headers(
    record: Record,
    error: BaseException,
    attempts: int,
    stage: str,
    *,
    retried: bool = False,
    extra: dict[str, str] | None = None,
) -> list[tuple[str, bytes | None]]:
    """The original headers followed by Offtake's, so nothing the producer set is lost, and
    exactly one copy of each of Offtake's: a producer's own ``offtake.*`` headers are renamed
    ``producer.offtake.*`` (kept, never read), so no reader can take them for Offtake's.

    ``retried``: the record was consumed from one of the pipeline's retry topics, so Offtake's
    headers on it are from an earlier attempt. They are replaced, except where it first came
    from (``offtake.original.*``), which is carried forward when it reads strictly.
    """
    headers, origin = _carried(record, retried)
    ours = {
        H_TOPIC: origin.topic,
        H_PARTITION: "" if origin.partition is None else str(origin.partition),
        H_OFFSET: "" if origin.offset is None else str(origin.offset),
        H_TIMESTAMP: "" if origin.timestamp is None else str(origin.timestamp),
        H_ERROR_CLASS: f"{type(error).__module__}.{type(error).__qualname__}",
        H_ERROR_MESSAGE: describe_error(error)[:4096],
        H_ATTEMPTS: str(attempts),
        H_STAGE: stage,
        # Errors that say more than their message (a schema decode error: schema id, reason).
        **getattr(error, "headers", {}),
        **(extra or {}),
    }
    return [*headers, *((k, v.encode("utf-8")) for k, v in ours.items())]


def header(headers: Sequence[tuple[str, bytes | None]] | None, name: str) -> str | None:
    """The last value of header ``name`` as text, or None."""
    found = last(headers, name)
    return None if found is None else found.decode("utf-8", "replace")


class DeadLetterQueue:
    """Sends records to the DLQ topic; ``on_done(error)`` fires when the broker confirmed.

    Only the processing thread uses it (sends, polls, flushes), so delivery callbacks run
    there too, and a full producer queue makes that thread wait, never the poll loop.
    """

    def __init__(self, producer: ProducerLike, topic: str) -> None:
        self.producer = producer
        self.topic = topic

    def send(
        self,
        record: Record,
        error: BaseException,
        attempts: int,
        stage: str,
        on_done: Callable[[BaseException | None], None],
        *,
        retried: bool = False,
    ) -> None:
        def delivered(err: Any, _msg: Any) -> None:
            on_done(
                None if err is None else RuntimeError(f"DLQ delivery to {self.topic} failed: {err}")
            )

        headers = dlq_headers(record, error, attempts, stage, retried=retried)
        produce_waiting(
            self.producer,
            self.topic,
            value=record.raw_value,
            key=record.key,
            headers=headers,
            on_delivery=delivered,
        )

    def poll(self) -> None:
        self.producer.poll(0)

    def in_flight(self) -> int:
        """Records sent and not yet reported on (librdkafka's queue and delivery reports)."""
        return len(self.producer)

    def flush(self, timeout: float) -> bool:
        return self.producer.flush(timeout) == 0
