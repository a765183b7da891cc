"""Test-only faults of the memory broker: failed and stalled deliveries.

Owns :class:`Delivery` (one produced record on its way to its report), :class:`Outbox` (a
producer's reports waiting to be served by its ``poll()``) and :class:`FaultInjector`, the
state behind :meth:`MemoryBroker.fail_produce` and :meth:`MemoryBroker.stall`. No lock of its
own: every method runs with the broker lock held, and the injector never calls application
code (delivery callbacks run later, in the producer's ``poll()``).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from confluent_kafka import OFFSET_INVALID, KafkaError

from .errors import kafka_error
from .messages import DeliveryCallback, Entry, MemoryMessage
from .storage import TopicStore


class Outbox:
    """A producer's delivery reports, ready for its ``poll()``."""

    def __init__(self, cond: threading.Condition) -> None:
        self._cond = cond
        self.ready: deque[Delivery] = deque()
        self.killed = False  # the producer was killed: its reports are never served

    def put(self, d: Delivery) -> None:
        self.ready.append(d)
        self._cond.notify_all()


@dataclass(eq=False)
class Delivery:
    outbox: Outbox
    topic: str
    partition: int
    entry: Entry
    callback: DeliveryCallback | None
    expires: float  # monotonic time: message.timeout.ms after produce()
    offset: int = OFFSET_INVALID
    error: KafkaError | None = None

    def report(self) -> MemoryMessage:
        e = self.entry
        return MemoryMessage(
            self.topic,
            self.partition,
            self.offset,
            e.key,
            e.value,
            e.headers,
            e.timestamp,
            self.error,
        )


class FaultInjector:
    """Deliveries a test made fail or hang; call every method with the broker lock held."""

    def __init__(self, cond: threading.Condition, store: TopicStore) -> None:
        self._cond = cond
        self._store = store
        self._stalls: dict[str, float] = {}  # topic -> monotonic end (inf: until unstall)
        self._failures: dict[str, deque[KafkaError]] = {}
        self._in_transit: list[Delivery] = []  # stalled deliveries, in produce order

    def fail(self, topic: str, errors: list[KafkaError]) -> None:
        self._failures.setdefault(topic, deque()).extend(errors)

    def stall(self, topic: str, until: float) -> None:
        self._stalls[topic] = until

    def unstall(self, topic: str) -> None:
        self._stalls.pop(topic, None)

    def intercept(self, d: Delivery) -> bool:
        """Fail or hold a new delivery if a test asked for it; False lets it through."""
        failures = self._failures.get(d.topic)
        if failures:
            d.error = failures.popleft()
            d.outbox.put(d)
            return True
        if d.topic in self._stalls:
            self._in_transit.append(d)
            return True
        return False

    def tick(self, now: float) -> None:
        """End stalls whose time is up; write (or time out) the deliveries they held."""
        for topic, until in list(self._stalls.items()):
            if until <= now:
                del self._stalls[topic]
        if not self._in_transit:
            return
        keep: list[Delivery] = []
        for d in self._in_transit:
            if d.outbox.killed:
                continue
            if d.topic not in self._stalls:
                d.offset = self._store.append(d.topic, d.partition, d.entry)
                d.outbox.put(d)
            elif now >= d.expires:
                d.error = kafka_error(
                    KafkaError._MSG_TIMED_OUT,
                    "Local: Message timed out (topic stalled by the test)",
                    retriable=True,
                )
                d.outbox.put(d)
            else:
                keep.append(d)
        if len(keep) != len(self._in_transit):
            self._in_transit = keep
            self._cond.notify_all()

    def purge(self, outbox: Outbox) -> None:
        """Fail a producer's held deliveries with ``_PURGE_QUEUE``."""
        keep = []
        for d in self._in_transit:
            if d.outbox is outbox:
                d.error = kafka_error(KafkaError._PURGE_QUEUE, "Local: Purged in queue")
                outbox.put(d)
            else:
                keep.append(d)
        self._in_transit = keep

    def drop(self, outbox: Outbox) -> None:
        """Forget a killed producer's held deliveries: they are never written."""
        self._in_transit = [d for d in self._in_transit if d.outbox is not outbox]
