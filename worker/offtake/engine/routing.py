"""Routing: where each processed record goes, and how the sink's reports settle records.

On the processing thread (:mod:`offtake.engine.processing_stage` is its only user). A
processed record's :class:`~offtake.processing.base.Outcome` sends it on:

- values: to the sink, one :class:`~offtake.sinks.base.SinkBatch` per partition of the records
  routed together (a poll's records of a partition: one batch);
- no values and no error: settled as ``dropped``;
- :class:`offtake.Backpressure` ("slow down"): parked for its ``retry_after`` with the same
  attempt, its partition held, and the poll loop asked to pause the partition (with
  processor.concurrency > 1 its lane is held instead, by the scheduler, and the partition is
  paused only in partition order);
- a retriable error with attempts left: parked for the backoff (strict ordering: holding its
  partition), returned to the caller, which parks it;
- any other error: to the error policy (dead letter, skip, retry topic, stop).

A record of a partition held by a parked record waits behind it (:mod:`offtake.engine.parking`).
The sink's settlements come back here (the one callback :meth:`Router.start` registers) and
settle the records in :class:`~offtake.engine.settlements.Settlements`, one entry per settled
batch; a record that failed in the sink goes to the error policy, its neighbours are not
touched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from offtake.engine.errors import ErrorPolicy
from offtake.engine.parking import Attempt, Parking
from offtake.engine.scheduler import Order
from offtake.engine.settlements import Settlements
from offtake.formats.errors import DecodeError
from offtake.kafka.protocols import MessageLike
from offtake.metrics import Metrics
from offtake.processing.base import Backpressure as SlowDown
from offtake.processing.base import Outcome
from offtake.records import Record, TopicPartition, make_record
from offtake.sinks.base import Sink, SinkBatch, SinkItem

log = logging.getLogger("offtake.processing")


class Router:
    def __init__(
        self,
        sink: Sink,
        policy: ErrorPolicy,
        settlements: Settlements,
        metrics: Metrics,
        parking: Parking,
        current: Callable[[], Mapping[TopicPartition, int]],
        max_retries: int,
        strict_ordering: bool,
        lanes: Order | None = None,
    ) -> None:
        self.sink = sink
        self.policy = policy
        self.settlements = settlements
        self.metrics = metrics
        self.parking = parking
        self.current = current  # the poll loop's published assignment epochs
        self.max_retries = max_retries
        self.strict = strict_ordering
        # processor.concurrency > 1: the scheduler's lanes hold what a parked record holds
        # (engine/scheduler.py), so no partition is held here; a slow-down pauses its
        # partition only where the order is the partition's.
        self.lanes = lanes
        self.out = 0  # records handed to the sink and not yet reported (this thread only)

    def start(self) -> None:
        """Register the sink's settlement callback (before the sink's first use)."""
        self.sink.start(self._on_settled)

    def route(self, todo: list[Attempt], outcomes: list[Outcome]) -> list[Attempt]:
        """Send results on; return the records to retry (with their next attempt number)."""
        retry: list[Attempt] = []
        to_sink: list[SinkItem] = []
        runs: list[int] = []  # where in to_sink each partition's run starts: one batch each
        current = self.current()
        parking, holds = self.parking, self.parking.holds
        # The last (topic, partition, epoch) found current, compared field by field: a run of
        # one partition's records makes no tuple per record.
        c_topic, c_partition, c_epoch = "", -1, -1
        new = tuple.__new__  # SinkItem(...) without its Python __new__: once per record
        for (record, epoch, attempts), outcome in zip(todo, outcomes, strict=True):
            if record.partition != c_partition or epoch != c_epoch or record.topic != c_topic:
                if current.get(record.tp) != epoch:
                    continue  # its partition was revoked or lost meanwhile
                c_topic, c_partition, c_epoch = record.topic, record.partition, epoch
                runs.append(len(to_sink))
            parked = False  # this record is the parked one holding its partition
            if holds and (hold := parking.hold_of(record.tp, epoch)) is not None:
                if hold.offset != record.offset:
                    parking.hold_behind(hold, (record, epoch, attempts, outcome))
                    continue
                parked = True
            elif outcome.error is None and outcome.values:  # the common case, first
                to_sink.append(new(SinkItem, (record, outcome.values, epoch, attempts)))
                continue
            if isinstance(outcome.error, SlowDown):
                self._slow_down(record, epoch, attempts, outcome.error, parked)
                continue  # a parked record holds its partition until it is settled
            if outcome.ok:
                if outcome.values:
                    to_sink.append(SinkItem(record, outcome.values, epoch, attempts))
                else:
                    self.settlements.put(record.tp, record.offset, epoch, "dropped")
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
            now = time.monotonic()  # one clock read: the batches' sink latency
            for start, end in zip(runs, [*runs[1:], len(to_sink)], strict=True):
                if start < end:
                    self.submit(SinkBatch.of(to_sink[start:end], now))
        return retry

    def _slow_down(
        self, record: Record, epoch: int, attempts: int, exc: SlowDown, parked: bool
    ) -> None:
        """offtake.Backpressure: park the record (same attempt) and hold its partition."""
        log.info("%s: processor asked to slow down (%s)", record.where(), exc)
        self.parking.park(record, epoch, attempts, time.monotonic() + exc.retry_after)
        if self.lanes is None and not parked:
            self.parking.hold(record.tp, record.offset, epoch)
        if self.lanes in (None, "partition"):
            self.settlements.request_slow_down(record.tp, epoch, time.time() + exc.retry_after)

    def submit(self, batch: SinkBatch) -> None:
        """Hand a batch to the sink (a forward too: a poll's records of a partition as they
        are); it comes back through :meth:`_on_settled`."""
        self.out += len(batch)
        try:
            self.sink.submit(batch)
        except Exception as exc:  # a broken sink: it settles nothing of it, every record fails
            self._on_settled(batch, dict.fromkeys(range(len(batch)), exc))

    # -- the sink's settlements (on this thread: see processing_stage) ---------------------
    def _on_settled(self, batch: SinkBatch, failed: Mapping[int, BaseException]) -> None:
        """The sink's one callback: a batch settled, with the records that failed and why."""
        self.out -= len(batch)
        if batch.submitted:
            self.metrics.sink_seconds.observe(time.monotonic() - batch.submitted)
        if not failed:
            self.settlements.put_many(batch.tp, batch.offsets, batch.epoch, "delivered")
            return
        offsets = [o for i, o in enumerate(batch.offsets) if i not in failed]
        if offsets:
            self.settlements.put_many(batch.tp, offsets, batch.epoch, "delivered")
        for i in sorted(failed):  # a failing record does not fail its neighbours
            if batch.messages is None:
                item = batch.items[i]
                record, attempts = item.record, item.attempts
            else:
                record, attempts = as_consumed(batch.messages[i], batch.tp, batch.offsets[i]), 1
            self.policy.exhausted(record, batch.epoch, failed[i], attempts, "sink")


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
