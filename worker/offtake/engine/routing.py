"""Routing: where each processed record goes, and how the sink's reports settle records.

On the processing thread (:mod:`offtake.engine.processing_stage` is its only user). A
processed record's :class:`~offtake.processing.base.Outcome` sends it on:

- values: to the sink, one batch for the records routed together;
- no values and no error: settled as ``dropped``;
- :class:`offtake.Backpressure` ("slow down"): parked for its ``retry_after`` with the same
  attempt, its partition held, and the poll loop asked to pause the partition;
- a retriable error with attempts left: parked for the backoff (strict ordering: holding its
  partition), returned to the caller, which parks it;
- any other error: to the error policy (dead letter, skip, retry topic, stop).

A record of a partition held by a parked record waits behind it (:mod:`offtake.engine.parking`).
The sink's reports come back here (the callbacks :meth:`Router.start` registers) and settle
the records in :class:`~offtake.engine.completions.Completions`, one entry per partition of a
sink batch; a failed delivery goes to the error policy, its neighbours are not touched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from offtake.engine.completions import Completions
from offtake.engine.errors import ErrorPolicy
from offtake.engine.parking import Attempt, Parking
from offtake.kafka.protocols import MessageLike
from offtake.metrics import Metrics
from offtake.processing.base import Backpressure as SlowDown
from offtake.processing.base import Outcome
from offtake.processing.decode import DecodeError
from offtake.records import Record, TopicPartition, make_record
from offtake.sinks.base import Forward, Sink, SinkItem

log = logging.getLogger("offtake.processing")


class Router:
    def __init__(
        self,
        sink: Sink,
        policy: ErrorPolicy,
        completions: Completions,
        metrics: Metrics,
        parking: Parking,
        current: Callable[[], Mapping[TopicPartition, int]],
        max_retries: int,
        strict_ordering: bool,
    ) -> None:
        self.sink = sink
        self.policy = policy
        self.completions = completions
        self.metrics = metrics
        self.parking = parking
        self.current = current  # the poll loop's published assignment epochs
        self.max_retries = max_retries
        self.strict = strict_ordering
        self.out = 0  # records handed to the sink and not yet reported (this thread only)

    def start(self, forwarding: bool) -> None:
        """Register the sink's report callbacks (before the sink's first use)."""
        self.sink.start(self._on_sink_complete, self._on_sink_batch_complete)
        if forwarding:
            self.sink.start_forwarding(self._on_forwarded)

    def route(self, todo: list[Attempt], outcomes: list[Outcome]) -> list[Attempt]:
        """Send results on; return the records to retry (with their next attempt number)."""
        retry: list[Attempt] = []
        to_sink: list[SinkItem] = []
        current = self.current()
        parking = self.parking
        checked: tuple[str, int, int] | None = None  # last (topic, partition, epoch) found current
        for (record, epoch, attempts), outcome in zip(todo, outcomes, strict=True):
            if checked != (record.topic, record.partition, epoch):
                if current.get(record.tp) != epoch:
                    continue  # its partition was revoked or lost meanwhile
                checked = (record.topic, record.partition, epoch)
            parked = False  # this record is the parked one holding its partition
            if parking.holding and (hold := parking.hold_of(record.tp, epoch)) is not None:
                if hold.offset != record.offset:
                    parking.hold_behind(hold, (record, epoch, attempts, outcome))
                    continue
                parked = True
            elif outcome.error is None and outcome.values:  # the common case, first
                to_sink.append(SinkItem(record, outcome.values, epoch, attempts))
                continue
            if isinstance(outcome.error, SlowDown):
                self._slow_down(record, epoch, attempts, outcome.error, parked)
                continue  # a parked record holds its partition until it is settled
            if outcome.ok:
                if outcome.values:
                    to_sink.append(SinkItem(record, outcome.values, epoch, attempts))
                else:
                    self.completions.put(record.tp, record.offset, epoch, "dropped")
            elif outcome.retriable and attempts <= self.max_retries:
                self.metrics.errors.labels("process").inc()
                self.metrics.retries.inc()
                retry.append((record, epoch, attempts + 1))
                if self.strict and not parked:
                    parking.hold(record.tp, record.offset, epoch)
                continue  # a parked record holds its partition until it is settled
            elif outcome.retriable:
                assert outcome.error is not None
                self.policy.exhausted(record, epoch, outcome.error, attempts, "process")
            else:
                assert outcome.error is not None
                stage = "decode" if isinstance(outcome.error, DecodeError) else "process"
                self.policy.give_up(record, epoch, outcome.error, attempts, stage)
            if parked:
                parking.settled(record.tp)
        if to_sink:
            self._to_sink(to_sink)
        return retry

    def _slow_down(
        self, record: Record, epoch: int, attempts: int, exc: SlowDown, parked: bool
    ) -> None:
        """offtake.Backpressure: park the record (same attempt) and hold its partition."""
        log.info("%s: processor asked to slow down (%s)", record.where(), exc)
        self.parking.park(record, epoch, attempts, time.monotonic() + exc.retry_after)
        if not parked:
            self.parking.hold(record.tp, record.offset, epoch)
        self.completions.request_slow_down(record.tp, epoch, time.time() + exc.retry_after)

    def _to_sink(self, items: list[SinkItem]) -> None:
        """One sink batch; ``items`` in consumption order (of one partition, mostly)."""
        items[0].submitted = time.monotonic()  # one clock read: the batch's sink latency
        self.out += len(items)
        for item, exc in self.sink.submit_batch(items):
            self.out -= 1
            self.policy.exhausted(item.record, item.epoch, exc, item.attempts, "sink")

    def forward(self, forward: Forward) -> None:
        """Pass-through: hand a poll's records of a partition to the sink as they are."""
        self.out += len(forward.messages)
        self.sink.forward(forward)

    # -- the sink's reports (fire on this thread: see processing_stage) --------------------
    def _on_sink_complete(self, item: SinkItem, error: BaseException | None) -> None:
        """The sink's callback for one item."""
        self._on_sink_batch_complete([item], {} if error is None else {0: error})

    def _on_forwarded(self, forward: Forward, failed: dict[int, BaseException]) -> None:
        """The sink's callback for a forward: one settlement for all its records."""
        self.out -= len(forward.messages)
        self.metrics.sink_seconds.observe(time.monotonic() - forward.submitted)
        if not failed:
            self.completions.put_many(forward.tp, forward.offsets, forward.epoch, "delivered")
            return
        offsets = [o for i, o in enumerate(forward.offsets) if i not in failed]
        if offsets:
            self.completions.put_many(forward.tp, offsets, forward.epoch, "delivered")
        for i, error in failed.items():  # a failing record does not fail its neighbours
            record = as_consumed(forward.messages[i], forward.tp, forward.offsets[i])
            self.policy.exhausted(record, forward.epoch, error, 1, "sink")

    def _on_sink_batch_complete(
        self, items: list[SinkItem], failed: dict[int, BaseException]
    ) -> None:
        """The sink's callback for items finished together: one settlement per partition."""
        self.out -= len(items)
        if items and items[0].submitted:
            self.metrics.sink_seconds.observe(time.monotonic() - items[0].submitted)
        # Keyed by plain tuples: a TopicPartition is made once per partition, not per item.
        delivered: dict[tuple[str, int, int], list[int]] = {}
        for i, item in enumerate(items):
            error = failed.get(i) if failed else None
            record = item.record
            if error is None:
                key = (record.topic, record.partition, item.epoch)
                offsets = delivered.get(key)
                if offsets is None:
                    delivered[key] = [record.offset]
                else:
                    offsets.append(record.offset)
            else:  # a failing record does not fail its neighbours
                self.policy.exhausted(record, item.epoch, error, item.attempts, "sink")
        for (topic, partition, epoch), offsets in delivered.items():
            self.completions.put_many(TopicPartition(topic, partition), offsets, epoch, "delivered")


def as_consumed(msg: MessageLike, tp: TopicPartition, offset: int) -> Record:
    """A forwarded record for the error policy, as consumed: forwarding runs only for
    ``format: bytes``, so its value is its bytes and there is nothing to decode again."""
    ts_type, ts = msg.timestamp()
    headers = msg.headers()
    value = msg.value()
    return make_record(
        tp.topic,
        tp.partition,
        offset,
        msg.key(),
        value,
        tuple(headers) if headers else (),
        ts if ts_type != 0 and ts >= 0 else None,
        value,
    )
