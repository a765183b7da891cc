"""The processor contract: records in, one outcome per record out.

A processor takes a batch of records (of any partitions, in consumption order) and returns,
for each record in the same order, either the list of values to send on (empty to drop the
record) or the exception that processing raised. Per-record failures are outcomes, not
exceptions: one bad record must not fail its neighbours. The engine retries failed records
with backoff (``spec.errors``) and then applies the error policy.

An exception raised by ``process`` itself means the processor could not be reached at all
(a sidecar that is down, say): the engine retries the whole batch without counting an
attempt against any record, so an unavailable processor stalls the pipeline (and in time its
in-flight bound: backpressure), never loses data.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, NamedTuple

from offtake.errors import OfftakeError
from offtake.records import Record


class Outcome(NamedTuple):
    """What processing made of one record: values to send on, or the error it raised.

    A tuple, not a dataclass: one is made per record processed, and a tuple is made in about
    half the time of a frozen dataclass (engine hot path, docs/bench.md).
    """

    values: list[Any]
    error: BaseException | None = None
    # False for errors that will fail the same way again (a record that cannot be decoded).
    retriable: bool = True

    @property
    def ok(self) -> bool:
        return self.error is None


class Backpressure(OfftakeError):
    """Raised by a processing function: "slow down", its downstream is saturated.

    Not a failure: the record is not charged an attempt, counted as an error or dead-lettered.
    The worker pauses the record's partition (it keeps polling the others), and after
    ``retry_after`` seconds processes the record again, with the records behind it on its
    partition in order.
    """

    def __init__(self, retry_after: float = 1.0, reason: str = "") -> None:
        if not retry_after >= 0:  # also catches NaN
            raise ValueError(f"offtake.Backpressure: retry_after must be >= 0, got {retry_after!r}")
        super().__init__(reason or f"downstream saturated: retry after {retry_after:g}s")
        self.retry_after = float(retry_after)

    def __reduce__(self) -> tuple[type[Backpressure], tuple[float, str]]:
        # Pickled from a pool process (processing/parallel.py) with both arguments: the
        # default would call Backpressure(message) and take the message for retry_after.
        return (Backpressure, (self.retry_after, str(self)))


class ProcessorUnavailable(OfftakeError):
    """The processor could not be reached; the batch is retried, no record is charged."""


class Processor(ABC):
    """Turns records into outcomes; see the module docstring for the contract."""

    @abstractmethod
    def process(self, records: Sequence[Record]) -> list[Outcome]: ...

    def open(self) -> None:
        """Before the first call: open what the calls share (processor.lifespan)."""

    def close(self) -> None:
        """Release resources (HTTP sessions, ...)."""
