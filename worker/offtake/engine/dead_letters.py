"""The dead-letter topic: failed records, byte for byte, with headers saying what happened."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from offtake.kafka.produce import produce_waiting
from offtake.kafka.protocols import ProducerLike
from offtake.records import Record

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
    """
    if type(error).__module__.startswith("offtake."):
        return str(error)
    return f"{type(error).__name__}: {error}"


H_RETRY_DUE = "offtake.retry.due"  # on retry topics: when to process it, ms since the epoch
H_RETRY_TOPIC = "offtake.retry.topic"  # on retry topics: the retry topic it was sent to
_ORIGIN = (H_TOPIC, H_PARTITION, H_OFFSET, H_TIMESTAMP)
# A schema decode error's (offtake.processing.schema_formats): the schema id and the reason.
H_SCHEMA_ID = "offtake.schema.id"
H_REASON = "offtake.error.reason"
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


def dlq_headers(
    record: Record,
    error: BaseException,
    attempts: int,
    stage: str,
    *,
    retried: bool = False,
    extra: dict[str, str] | None = None,
) -> list[tuple[str, bytes | None]]:
    """The original headers followed by Offtake's, so nothing the producer set is lost.

    ``retried``: the record was consumed from one of the pipeline's retry topics, so Offtake's
    headers on it are from an earlier attempt. They are replaced, except where it first came
    from (``offtake.original.*``), which is carried forward unchanged.
    """
    origin = {
        H_TOPIC: record.topic,
        H_PARTITION: str(record.partition),
        H_OFFSET: str(record.offset),
        H_TIMESTAMP: "" if record.timestamp is None else str(record.timestamp),
    }
    headers = list(record.headers)
    if retried:
        earlier = {k: v for k, v in headers if k in _ORIGIN and v is not None}
        origin.update({k: v.decode("utf-8", "replace") for k, v in earlier.items()})
        headers = [(k, v) for k, v in headers if k not in _OURS]
    ours = {
        **origin,
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
    found = None
    for k, v in headers or ():
        if k == name and v is not None:
            found = v
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
