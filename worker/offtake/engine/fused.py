"""A Work's records decoded, given to the function and made sink items in one pass.

At ``processor.concurrency`` 1 with a plain per-record function (:class:`FunctionProcessor`),
the steps the stage otherwise runs one after another over a whole Work -- the decoder's pass
(:meth:`Decoder.records <offtake.formats.base.Decoder.records>`), the attempts
(:mod:`offtake.engine.work`), the calls (:mod:`offtake.engine.processor_runs`), the routing of
the outcomes (:mod:`offtake.engine.routing`) -- run here as one loop per record: decode, make
the :class:`Record`, call, make the :class:`SinkItem`. No ``(record, error)`` pair, attempt
or :class:`Outcome` is made for a record that needs none (issue 42: per-record objects and
passes were most of the engine's CPU per record, docs/bench.md).

What the pass does not handle itself it hands to the stage's general path, one record at a
time, so every rule stays in one place: a record whose bytes the fast decoder refuses (a new
schema id, a value to explain, a tombstone) goes through the decoder's careful path and the
policy; a call that raised, returned nothing or returned an awaitable is routed as its
outcome (retry, slow-down, dead letter, dropped). The records before it go to the sink as one
batch first, so a partition's records still reach the sink in offset order; the pass then
goes on after it, unless that record now holds its partition (``errors.ordering: strict``, a
slow-down): then the rest of the Work takes the general path, which holds them behind it.

The stage runs the pass only when the general path would start every record at attempt 1
with nothing held on the partition (:meth:`applies`). On the processing thread only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from offtake.engine.parking import Attempt, Parking
from offtake.engine.routing import Router
from offtake.engine.work import Intake, Work
from offtake.formats.base import Decoder
from offtake.kafka.protocols import MessageLike
from offtake.metrics import Metrics
from offtake.processing.base import Outcome
from offtake.processing.function import AWAITABLES, FunctionProcessor
from offtake.records import Record, TopicPartition
from offtake.sinks.base import SinkBatch, SinkItem

# Where a pass stopped: the items made, the index of the record it did not handle (the Work's
# length when it handled all), and that record with its outcome if the function was called.
Stop = tuple[list[SinkItem], int, tuple[Record, Outcome] | None]


class FusedPass:
    """Runs a Work's common records in one pass (see the module's docstring)."""

    def __init__(
        self,
        decoder: Decoder,
        processor: FunctionProcessor,
        router: Router,
        parking: Parking,
        intake: Intake,
        metrics: Metrics,
        abort: threading.Event,
    ) -> None:
        self.decoder = decoder
        self.processor = processor
        self.router = router
        self.parking = parking
        self.intake = intake
        self.metrics = metrics
        self.abort = abort  # the stage's: set once it gives up on queued work

    def applies(self, work: Work) -> bool:
        """Whether the general path would start each record of ``work`` at attempt 1 with
        nothing held on its partition (the delivery mode numbers no attempts, or queue mode's
        records are all first deliveries)."""
        return self.intake.starts_fresh(work)

    def run(
        self,
        work: Work,
        general: Callable[[Work], None],
        route: Callable[[list[Attempt], list[Outcome]], None],
    ) -> None:
        """Send ``work``'s records on; ``general`` runs the stage's general path on a Work,
        ``route`` routes records with their outcomes (and parks what is to be retried)."""
        tp, epoch, messages, offsets = work.tp, work.epoch, work.messages, work.offsets
        n, start = len(messages), 0
        while start < n and not self.abort.is_set():  # given up: no call on what is left
            started = time.monotonic()
            items, stop, called = self._pass(messages, offsets, start, tp, epoch)
            now = time.monotonic()
            if stop > start:  # an empty pass processed no batch
                self.metrics.processing_seconds.observe(now - started)
            if self.abort.is_set():
                return  # given up meanwhile (the drain budget was spent): see ProcessorRuns.run
            if items and self.router.current().get(tp) == epoch:  # not revoked meanwhile
                done = offsets if start == 0 and stop == n else offsets[start:stop]
                self.router.submit(SinkBatch(tp, epoch, done, items, None, now))
            if stop == n:
                return
            if called is None:  # not decoded by the fast path: the careful one, alone
                general(Work(tp, epoch, messages[stop : stop + 1], offsets[stop : stop + 1]))
            else:
                route([(called[0], epoch, 1)], [called[1]])
            start = stop + 1
            if start < n and self.parking.hold_of(tp, epoch) is not None:
                # That record holds its partition now: the rest waits behind it.
                general(Work(tp, epoch, messages[start:], offsets[start:]))
                return

    def _pass(
        self,
        messages: Sequence[MessageLike],
        offsets: Sequence[int],
        start: int,
        tp: TopicPartition,
        epoch: int,
    ) -> Stop:
        """Records from ``start`` on, up to the first one the pass does not handle; ``offsets``
        are theirs, as the poll loop read them (Work.offsets)."""
        topic, partition = tp
        fast, slow_after = self.decoder.fast(topic)
        function = self.processor.function
        items: list[SinkItem] = []
        append = items.append
        new = tuple.__new__  # Record(...), SinkItem(...) without their Python __new__
        for i in range(start, len(messages)):
            msg = messages[i]
            raw = msg.value()
            if raw is None:  # a tombstone: the decoder's to read
                return items, i, None
            try:
                value = fast(raw)
            except slow_after:
                return items, i, None
            ts_type, ts = msg.timestamp()
            headers = msg.headers()
            record: Record = new(
                Record,
                (
                    topic,
                    partition,
                    offsets[i],
                    msg.key(),
                    value,
                    tuple(headers) if headers else (),
                    ts if ts_type != 0 and ts >= 0 else None,
                    raw,
                ),
            )
            try:
                result = function(record)
            except Exception as exc:  # user code: any exception is that record's failure
                return items, i, (record, Outcome([], exc))
            if isinstance(result, list):
                if not result:  # dropped
                    return items, i, (record, Outcome([], None, True))
                append(new(SinkItem, (record, result, epoch, 1)))
            elif result is None or isinstance(result, AWAITABLES):
                return items, i, (record, self.processor.outcome_of(result))
            else:
                append(new(SinkItem, (record, [result], epoch, 1)))
        return items, len(messages), None
