"""The Kafka sink: an idempotent producer; a batch is settled when every delivery report is in.

Accounting is per batch, not per record: a submitted :class:`~offtake.sinks.base.SinkBatch`
(one poll's records of a partition, in the engine) gets one :class:`_InFlight`, whose single
bound method is the delivery callback of every value produced for it. A report only draws the
next number from the batch's counter (``itertools.count``: atomic, so correct whichever thread
polls the producer); the report that draws the last number settles the whole batch with one
:meth:`~offtake.sinks.base.Sink.settle`. One produce loop writes both kinds of batch: the
values processing made (encoded with the pipeline's encoder) or consumed records as they are
(pass-through). The engine polls the producer from its processing thread only
(engine/processing_stage.py); the sink is also usable on its own (the contract suite polls
from two threads), and needs no lock per record for that either.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Collection
from typing import Any

from offtake.formats.plain import encode_value
from offtake.kafka.produce import produce_waiting
from offtake.kafka.protocols import ProducerLike
from offtake.records import TopicPartition
from offtake.sinks.base import Sink, SinkBatch, SinkError

Headers = list[tuple[str, bytes | None]] | None
# What the produce loop writes: (index of its record in the batch, key, value, headers).
Row = tuple[int, bytes | None, bytes | None, Headers]


class _InFlight:
    """A submitted batch whose delivery reports are not all in yet."""

    __slots__ = ("_count", "batch", "errors", "expected", "refused", "sink")

    def __init__(self, sink: KafkaSink, batch: SinkBatch, expected: int) -> None:
        self.sink = sink
        self.batch = batch
        # Every value is one report; values never produced (their record was refused) are
        # drawn by the producing loop instead, so the last number is drawn exactly once in all.
        self.expected = expected
        self._count = itertools.count(1)
        self.errors: list[tuple[Any, Any]] = []  # (error, message) of failed deliveries
        self.refused: dict[int, BaseException] = {}  # records that could not be produced

    def delivered(self, err: Any, msg: Any) -> None:
        """librdkafka's delivery report of one value (the callback of every value here)."""
        if err is not None:
            self.errors.append((err, msg))  # list.append is atomic
        if next(self._count) == self.expected:
            self.sink._finish(self)

    def refuse(self, i: int, error: BaseException, unsent: int) -> None:
        """Record ``i`` failed before it was produced (``error`` says why); ``unsent`` of its
        values never will be."""
        self.refused.setdefault(i, error)
        self.skip(unsent)

    def skip(self, n: int) -> None:
        """``n`` values will never be produced: count them as reported."""
        for _ in range(n):
            if next(self._count) == self.expected:
                self.sink._finish(self)

    def failures(self) -> dict[int, BaseException]:
        """The refused records and the failed deliveries, by index (rare: a failed delivery is
        found by the key and value produced)."""
        out = dict(self.refused)
        topic = self.sink.topic
        # Which records produced each (key, value), made once: a refused topic fails every
        # record of the batch, and matching each report against the whole batch anew would
        # encode the batch once per failed report.
        sent: dict[tuple[Any, Any], list[int]] = {}
        for index, key, value, _ in self.sink._rows(self.batch):
            sent.setdefault((key, value), []).append(index)
        for err, msg in self.errors:
            found = sent.get((msg.key(), msg.value()))
            if not found:  # no match (a value changed on the way?): fail all rather than lose
                failed = SinkError(f"delivery to {topic} failed: {err}")
                out.update({i: failed for i in range(len(self.batch)) if i not in out})
                continue
            # Identical records: each failed report takes the next one not failed yet.
            i = next((i for i in found if i not in out), None)
            if i is not None:
                where = self.batch.where(i)
                out[i] = SinkError(f"record {where}: delivery to {topic} failed: {err}")
        return out


class KafkaSink(Sink):
    """Produces each value to ``topic`` with the source record's key and headers."""

    name = "kafka"

    def __init__(
        self,
        producer: ProducerLike,
        topic: str,
        encode: Callable[[Any], bytes | None] = encode_value,
    ) -> None:
        """``encode``: a value to bytes; a format's encoder (offtake.formats)."""
        super().__init__()
        self.producer = producer
        self.topic = topic
        self.encode = encode
        # Forwarding writes consumed bytes as they are: only without a schema to encode with.
        self.forwards = encode is encode_value
        # Guards the in-flight table (one update per batch): abandon() may come from a thread
        # other than the one whose poll settles a batch.
        self._lock = threading.Lock()
        # Per source partition, so that abandon() can find what it must not settle.
        self._in_flight: dict[TopicPartition, set[_InFlight]] = {}

    def submit(self, batch: SinkBatch) -> None:
        """The one produce loop: every value of the batch, with its record's key and headers,
        encoded as it is produced (no row made per value: docs/bench.md, issue 42)."""
        messages = batch.messages
        if messages is None:
            expected = sum([len(it.values) for it in batch.items])
            if expected == 0:  # nothing to write: settled at once
                self.settle(batch)
                return
        else:
            expected = len(messages)
        pending = _InFlight(self, batch, expected)
        with self._lock:
            self._in_flight.setdefault(batch.tp, set()).add(pending)
        produce, topic, on_delivery = self.producer.produce, self.topic, pending.delivered
        # Positional (topic, value, key, partition, callback): confluent-kafka parses them in
        # about 60% of the time keyword arguments take, per record.
        if messages is not None:  # consumed records as they are (pass-through)
            for i, msg in enumerate(messages):
                headers = msg.headers()
                try:
                    if headers is None:
                        produce(topic, msg.value(), msg.key(), -1, on_delivery)
                    else:
                        produce(topic, msg.value(), msg.key(), -1, on_delivery, headers=headers)
                except Exception as exc:  # the local queue full, or this record only
                    self._not_produced(pending, i, msg.key(), msg.value(), headers, exc)
            return
        encode = self.encode
        for i, (record, values, _, _) in enumerate(batch.items):
            key, headers = record.key, list(record.headers) if record.headers else None
            if len(values) != 1:  # none or several (a record fanned out): rarer
                self._produce_several(pending, i, key, values, headers)
                continue
            try:
                data = encode(values[0])
            except Exception as exc:  # the value's fault: the encoder's error names the field
                pending.refuse(i, exc, 1)
                continue
            try:
                if headers is None:
                    produce(topic, data, key, -1, on_delivery)
                else:
                    produce(topic, data, key, -1, on_delivery, headers=headers)
            except Exception as exc:  # the local queue full, or this record only
                self._not_produced(pending, i, key, data, headers, exc)

    def _produce_several(
        self, pending: _InFlight, i: int, key: bytes | None, values: list[Any], headers: Headers
    ) -> None:
        """Record ``i``'s values, every one encoded before any is produced: a value that cannot
        be encoded fails its record with none of it sent."""
        try:
            encoded = [self.encode(value) for value in values]
        except Exception as exc:  # the value's fault: the encoder's error names the field
            pending.refuse(i, exc, len(values))
            return
        produce, topic, on_delivery = self.producer.produce, self.topic, pending.delivered
        for data in encoded:
            if i in pending.refused:  # an earlier value of this record was refused
                pending.skip(1)
                continue
            try:
                if headers is None:
                    produce(topic, data, key, -1, on_delivery)
                else:
                    produce(topic, data, key, -1, on_delivery, headers=headers)
            except Exception as exc:  # the local queue full, or this record only
                self._not_produced(pending, i, key, data, headers, exc)

    def _not_produced(
        self,
        pending: _InFlight,
        i: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        exc: Exception,
    ) -> None:
        """``produce`` raised for record ``i``'s value: wait for room if the local queue was
        full, else (too large, say) the record fails, not the rest."""
        if isinstance(exc, BufferError):
            try:
                produce_waiting(
                    self.producer,
                    self.topic,
                    value=value,
                    key=key,
                    headers=headers,
                    on_delivery=pending.delivered,
                )
                return
            except Exception as again:  # refused below, like the first
                exc = again
        where = pending.batch.where(i)
        failed = SinkError(f"record {where}: producing to {self.topic} failed: {exc}")
        pending.refuse(i, failed, 1)

    def _rows(self, batch: SinkBatch) -> list[Row]:
        """What was produced for ``batch``, to match failed delivery reports against: consumed
        records as they are, or each value encoded (a value that cannot be encoded has no row)."""
        if batch.messages is not None:
            return [(i, m.key(), m.value(), m.headers()) for i, m in enumerate(batch.messages)]
        rows: list[Row] = []
        encode = self.encode
        for i, (record, values, _, _) in enumerate(batch.items):
            key, headers = record.key, list(record.headers) if record.headers else None
            try:
                encoded = [encode(value) for value in values]
            except Exception:  # refused when produced: none of its values was sent
                continue
            rows.extend([(i, key, data, headers) for data in encoded])
        return rows

    def _take(self, pending: _InFlight) -> bool:
        """Take a finished batch off the in-flight table; False if it was abandoned."""
        with self._lock:
            mine = self._in_flight.get(pending.batch.tp)
            if mine is None or pending not in mine:
                return False  # abandoned: the engine no longer tracks these records
            mine.discard(pending)
            if not mine:
                del self._in_flight[pending.batch.tp]
            return True

    def _finish(self, pending: _InFlight) -> None:
        """Every report of a batch is in: settle it (unless abandoned meanwhile)."""
        if self._take(pending):
            failed = pending.failures() if pending.errors or pending.refused else {}
            self.settle(pending.batch, failed)

    def poll(self) -> None:
        self.producer.poll(0)

    def drain(self, partitions: Collection[TopicPartition] | None, timeout: float) -> bool:
        # A producer flushes everything; that is a superset of the partitions asked for.
        return self.producer.flush(timeout) == 0

    def abandon(self, partitions: Collection[TopicPartition]) -> int:
        """Stop settling the in-flight records of these partitions.

        Their values are on their way and may still be written (a producer cannot take a
        message back); their delivery reports are ignored, as the engine has forgotten them.
        """
        with self._lock:
            dropped = [self._in_flight.pop(tp, set()) for tp in set(partitions)]
        return sum(len(p.batch) for pendings in dropped for p in pendings)
