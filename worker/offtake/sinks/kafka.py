"""The Kafka sink: an idempotent producer; an item is done when every delivery report is in.

Accounting is per batch, not per record: the items handed over together (one poll's records of
a partition, in the engine) share one :class:`_Batch`, whose single bound method is the
delivery callback of every value produced for them. A report only draws the next number from
the batch's counter (``itertools.count``: atomic, so correct whichever thread polls the
producer); the report that draws the last number completes the whole batch with one
:meth:`~offtake.sinks.base.Sink.complete_batch`. The engine polls the producer from its
processing thread only (engine/processing_stage.py); the sink is also usable on its own (the
contract suite polls from two threads), and needs no lock per record for that either.
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
from offtake.sinks.base import Forward, Sink, SinkError, SinkItem


class _Batch:
    """Items of one source partition whose delivery reports are not all in yet."""

    __slots__ = ("_count", "errors", "expected", "given_back", "items", "sink", "tp")

    def __init__(self, sink: KafkaSink, tp: TopicPartition, items: list[SinkItem]) -> None:
        self.sink = sink
        self.tp = tp
        self.items = items
        # Every value is one report; values never produced (their item was given back) are
        # drawn by the submitter instead, so the last number is drawn exactly once in all.
        self.expected = sum(len(it.values) for it in items)
        self._count = itertools.count(1)
        self.errors: list[tuple[Any, Any]] = []  # (error, message) of failed deliveries
        self.given_back: set[int] = set()  # items whose produce raised: they never complete

    def delivered(self, err: Any, msg: Any) -> None:
        """librdkafka's delivery report of one value (the callback of every value here)."""
        if err is not None:
            self.errors.append((err, msg))  # list.append is atomic
        if next(self._count) == self.expected:
            self.sink._finish(self)

    def skip(self, n: int) -> None:
        """``n`` values will never be produced: count them as reported."""
        for _ in range(n):
            if next(self._count) == self.expected:
                self.sink._finish(self)

    def failures(self) -> dict[int, BaseException]:
        """The failed deliveries, by item index (rare: found by the value and key produced)."""
        out: dict[int, BaseException] = {}
        for err, msg in self.errors:
            for i, item in enumerate(self.items):
                if i in self.given_back or item.record.key != msg.key():
                    continue
                if msg.value() in (self.sink.encode(v) for v in item.values):
                    where = item.record.where()
                    out.setdefault(
                        i, SinkError(f"record {where}: delivery to {self.sink.topic} failed: {err}")
                    )
                    break
            else:  # no match (a value changed on the way?): fail the whole batch rather than lose
                failed = SinkError(f"delivery to {self.sink.topic} failed: {err}")
                out.update({i: failed for i in range(len(self.items)) if i not in out})
        return out


class _Forwarding:
    """A forward (consumed records written as they are) whose reports are not all in yet."""

    __slots__ = ("_count", "errors", "expected", "forward", "given_back", "sink")

    def __init__(self, sink: KafkaSink, forward: Forward) -> None:
        self.sink = sink
        self.forward = forward
        self.expected = len(forward.messages)
        self._count = itertools.count(1)
        self.errors: list[tuple[Any, Any]] = []
        self.given_back: dict[int, BaseException] = {}  # produce raised: failed at once

    @property
    def tp(self) -> TopicPartition:
        return self.forward.tp

    def delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append((err, msg))
        if next(self._count) == self.expected:
            self.sink._finish_forward(self)

    def skip(self) -> None:
        if next(self._count) == self.expected:
            self.sink._finish_forward(self)

    def failures(self) -> dict[int, BaseException]:
        out = dict(self.given_back)
        messages = self.forward.messages
        for err, msg in self.errors:
            key, value = msg.key(), msg.value()
            for i, m in enumerate(messages):
                if i not in out and m.key() == key and m.value() == value:
                    out[i] = SinkError(
                        f"record {_where(m)}: delivery to {self.sink.topic} failed: {err}"
                    )
                    break
            else:  # no match: fail what is not failed yet rather than lose a record
                failed = SinkError(f"delivery to {self.sink.topic} failed: {err}")
                out.update({i: failed for i in range(len(messages)) if i not in out})
        return out


def _where(msg: Any) -> str:
    return f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"


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
        # other than the one whose poll completes a batch.
        self._lock = threading.Lock()
        # Per source partition, so that abandon() can find what it must not report.
        self._in_flight: dict[TopicPartition, set[_Batch | _Forwarding]] = {}

    def submit(self, item: SinkItem) -> None:
        refused = self.submit_batch([item])
        if refused:
            raise refused[0][1]

    def submit_batch(self, items: list[SinkItem]) -> list[tuple[SinkItem, BaseException]]:
        # Keyed by plain tuples: a TopicPartition is made once per partition, not per item.
        by_tp: dict[tuple[str, int], list[SinkItem]] = {}
        for item in items:
            record = item.record
            key = (record.topic, record.partition)
            mine = by_tp.get(key)
            if mine is None:
                by_tp[key] = [item]
            else:
                mine.append(item)
        refused: list[tuple[SinkItem, BaseException]] = []
        for (topic, partition), mine in by_tp.items():
            refused.extend(self._submit_partition(TopicPartition(topic, partition), mine))
        return refused

    def _submit_partition(
        self, tp: TopicPartition, items: list[SinkItem]
    ) -> list[tuple[SinkItem, BaseException]]:
        batch = _Batch(self, tp, items)
        if batch.expected == 0:  # nothing to write: done at once
            self.complete_batch(items, {})
            return []
        with self._lock:
            self._in_flight.setdefault(tp, set()).add(batch)
        refused: list[tuple[SinkItem, BaseException]] = []
        produce, topic, on_delivery = self.producer.produce, self.topic, batch.delivered
        for i, item in enumerate(items):
            record = item.record
            key, headers = record.key, list(record.headers) if record.headers else None
            sent = 0
            try:
                for value in item.values:
                    payload = self.encode(value)
                    try:
                        # Positional where possible: see forward().
                        if headers is None:
                            produce(topic, payload, key, -1, on_delivery)
                        else:
                            produce(topic, payload, key, -1, on_delivery, headers=headers)
                    except BufferError:  # the local queue is full: wait for room
                        produce_waiting(
                            self.producer,
                            topic,
                            value=payload,
                            key=key,
                            headers=headers,
                            on_delivery=on_delivery,
                        )
                    sent += 1
            except Exception as exc:
                # Given back: the engine gives it up itself. Reports of its values already
                # sent still count towards the batch, and never complete it a second time.
                batch.given_back.add(i)
                refused.append((item, exc))
                batch.skip(len(item.values) - sent)
        return refused

    def forward(self, forward: Forward) -> None:
        """Produce consumed records as they are: key, value and headers; no object per record."""
        pending = _Forwarding(self, forward)
        with self._lock:
            self._in_flight.setdefault(forward.tp, set()).add(pending)
        produce, topic, on_delivery = self.producer.produce, self.topic, pending.delivered
        for i, msg in enumerate(forward.messages):
            headers = msg.headers()
            try:
                try:
                    # Positional (topic, value, key, partition, callback): confluent-kafka
                    # parses them in about 60% of the time keyword arguments take, per record.
                    if headers is None:
                        produce(topic, msg.value(), msg.key(), -1, on_delivery)
                    else:
                        produce(topic, msg.value(), msg.key(), -1, on_delivery, headers=headers)
                except BufferError:  # the local queue is full: wait for room
                    produce_waiting(
                        self.producer,
                        topic,
                        value=msg.value(),
                        key=msg.key(),
                        headers=headers,
                        on_delivery=on_delivery,
                    )
            except Exception as exc:  # this record only (too large, say): it fails, not the rest
                pending.given_back[i] = SinkError(
                    f"record {_where(msg)}: producing to {topic} failed: {exc}"
                )
                pending.skip()

    def _finish_forward(self, pending: _Forwarding) -> None:
        if self._take(pending):
            failed = pending.failures() if pending.errors or pending.given_back else {}
            self.complete_forward(pending.forward, failed)

    def _take(self, batch: _Batch | _Forwarding) -> bool:
        """Take a finished batch off the in-flight table; False if it was abandoned."""
        with self._lock:
            mine = self._in_flight.get(batch.tp)
            if mine is None or batch not in mine:
                return False  # abandoned: the engine no longer tracks these records
            mine.discard(batch)
            if not mine:
                del self._in_flight[batch.tp]
            return True

    def _finish(self, batch: _Batch) -> None:
        """Every report of a batch is in: complete its items (unless abandoned meanwhile)."""
        if not self._take(batch):
            return
        failed = batch.failures() if batch.errors else {}
        if batch.given_back:
            kept = [i for i in range(len(batch.items)) if i not in batch.given_back]
            index = {old: new for new, old in enumerate(kept)}
            failed = {index[i]: e for i, e in failed.items() if i in index}
            if kept:  # every item given back: the engine settles them itself, nothing to report
                self.complete_batch([batch.items[i] for i in kept], failed)
            return
        self.complete_batch(batch.items, failed)

    def poll(self) -> None:
        self.producer.poll(0)

    def drain(self, partitions: Collection[TopicPartition] | None, timeout: float) -> bool:
        # A producer flushes everything; that is a superset of the partitions asked for.
        return self.producer.flush(timeout) == 0

    def abandon(self, partitions: Collection[TopicPartition]) -> int:
        """Stop reporting the in-flight items of these partitions.

        Their values are on their way and may still be written (a producer cannot take a
        message back); their delivery reports are ignored, as the engine has forgotten them.
        """
        with self._lock:
            dropped = [self._in_flight.pop(tp, set()) for tp in set(partitions)]
        return sum(_items(b) for batches in dropped for b in batches)


def _items(batch: _Batch | _Forwarding) -> int:
    if isinstance(batch, _Batch):
        return len(batch.items) - len(batch.given_back)
    return len(batch.forward.messages)
