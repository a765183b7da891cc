"""A :class:`Work`, the unit the engine moves, and how its records become attempts.

The poll loop (:mod:`offtake.engine.worker`) makes a Work of each poll's records of a
partition and hands it to the processing thread (:mod:`offtake.engine.processing_stage`),
which asks :class:`Intake` for the Work's attempts before it runs the processor on them:
the records decoded in one pass (waiting out an unreachable schema registry: not the records'
fault, nothing is dead-lettered), each numbered as the delivery mode says
(:attr:`DeliveryMode.first_attempt <offtake.engine.delivery.base.DeliveryMode.first_attempt>`),
and the ones that must not run taken out: a record that failed to decode, or one delivered
more often than ``errors.maxRetries`` allows, goes to the error policy; a record behind a
parked one of its partition waits behind it (:mod:`offtake.engine.parking`).

On the processing thread only, like everything the stage runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from offtake.engine.errors import UNAVAILABLE_BACKOFF_CAP, ErrorPolicy
from offtake.engine.parking import Attempt, Parking
from offtake.errors import OfftakeError
from offtake.formats.base import Decoded, Decoder
from offtake.formats.errors import RegistryUnavailable
from offtake.kafka.protocols import MessageLike
from offtake.processing.base import Outcome
from offtake.records import TopicPartition

log = logging.getLogger("offtake.processing")


@dataclass(slots=True)
class Work:
    """Records of one partition from one poll, in offset order: the unit the engine moves.

    The poll loop registered them with the offset tracker as one chunk (``offsets``); they go
    to the sink as one :class:`~offtake.sinks.base.SinkBatch`, and when all of them are
    delivered they settle with one entry in :class:`Settlements`.
    """

    tp: TopicPartition
    epoch: int  # of the partition's assignment they were consumed in
    messages: list[MessageLike]
    offsets: list[int]


class DeliveredTooOften(OfftakeError):
    """Queue mode: a record delivered more often than errors.maxRetries + 1 attempts allow
    (its earlier deliveries ended without an outcome: the workers that had it stopped or
    crashed), so errors.policy applies without another attempt."""

    def __init__(self, deliveries: int) -> None:
        super().__init__(
            f"delivered {deliveries} times without an outcome (errors.maxRetries exceeded: "
            "the workers that had it stopped or crashed)"
        )


class Intake:
    """A :class:`Work`'s records made attempts (see the module's docstring)."""

    def __init__(
        self,
        decoder: Decoder,
        policy: ErrorPolicy,
        parking: Parking,
        max_retries: int,
        abort: threading.Event,
        serve: Callable[[], None],
    ) -> None:
        self.decoder = decoder
        self.policy = policy
        self.parking = parking
        self.max_retries = max_retries
        self.abort = abort  # the stage's: set once it gives up on queued work
        self.serve = serve  # the stage's: lets deliveries under way complete while we wait
        # A record's first attempt number, as the delivery mode says
        # (DeliveryMode.first_attempt; set by build_worker); None: every record starts at 1.
        self.first_attempt: Callable[[MessageLike], int] | None = None
        # Whether all of a Work's records start at 1 even so (DeliveryMode.all_first_attempts,
        # queue mode: none was delivered before): they take the fast path too.
        self.all_first: Callable[[list[MessageLike]], bool] | None = None

    def starts_fresh(self, work: Work) -> bool:
        """Whether every record of ``work`` starts at attempt 1 with nothing held on its
        partition: the common case, which takes the fast paths (the one comprehension below,
        and :mod:`offtake.engine.fused`)."""
        return self.parking.hold_of(work.tp, work.epoch) is None and (
            self.first_attempt is None
            or (self.all_first is not None and self.all_first(work.messages))
        )

    def attempts(self, work: Work) -> list[Attempt] | None:
        """The records of ``work`` to process, each with its attempt number; None once the
        stage aborts while the registry is unreachable (the drain budget was spent)."""
        epoch = work.epoch
        decoded_all = self._decode(work)
        if decoded_all is None:
            return None
        if self.starts_fresh(work):
            # The common case, one comprehension: nothing held on the partition, attempts
            # start at 1; only records that failed to decode go to the policy one by one.
            todo = [(record, epoch, 1) for record, error in decoded_all if error is None]
            if len(todo) < len(decoded_all):
                for record, error in decoded_all:
                    if error is not None:
                        self.policy.give_up(record, epoch, error, 1, "decode")
            return todo
        return self._numbered(work, decoded_all)

    def _numbered(self, work: Work, decoded_all: list[Decoded]) -> list[Attempt]:
        """The records to process, each with its attempt number; the others go to the policy or
        wait behind the parked record of their partition."""
        epoch = work.epoch
        todo: list[Attempt] = []
        parking = self.parking
        first = self.first_attempt
        for (record, decode_error), msg in zip(decoded_all, work.messages, strict=True):
            # Past the last attempt (its earlier ones made elsewhere: DeliveryMode
            # .first_attempt) a record goes to the policy unrun.
            attempt = first(msg) if first is not None else 1
            hold = parking.hold_of(record.tp, epoch)
            if hold is not None:  # behind a parked record of its partition
                failed = None if decode_error is None else Outcome([], decode_error, False)
                parking.hold_behind(hold, (record, epoch, attempt, failed))
            elif decode_error is not None:
                self.policy.give_up(record, epoch, decode_error, attempt, "decode")
            elif attempt > self.max_retries + 1:
                self.policy.exhausted(record, epoch, DeliveredTooOften(attempt), attempt, "process")
            else:
                todo.append((record, epoch, attempt))
        return todo

    def _decode(self, work: Work) -> list[Decoded] | None:
        """The poll's decoded records; while the schema registry is unreachable this waits and
        retries with backoff (not the record's fault: no dead letter), and the in-flight bound then
        pauses the partitions (backpressure). None once the stage aborts."""
        outage = 0
        while True:
            try:
                return self.decoder.records(work.messages, *work.tp)
            except RegistryUnavailable as exc:
                outage += 1
                delay = min(max(self.policy.backoff(outage), 0.1), UNAVAILABLE_BACKOFF_CAP)
                log.warning(
                    "%s; retrying in %.1fs (records wait, nothing is dead-lettered)", exc, delay
                )
                self.serve()  # deliveries already under way still complete meanwhile
                if self.abort.wait(delay):
                    return None
