"""The Kafka sink: an idempotent producer; an item is done when every delivery report is in."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from typing import Any

from offtake.kafka.produce import produce_waiting
from offtake.kafka.protocols import ProducerLike
from offtake.records import TopicPartition
from offtake.sinks.base import Sink, SinkError, SinkItem
from offtake.sinks.encoding import encode_value


class _InFlight:
    """One submitted item whose delivery reports are not all in yet."""

    __slots__ = ("error", "item", "remaining")

    def __init__(self, item: SinkItem) -> None:
        self.item = item
        self.remaining = len(item.values)
        self.error: BaseException | None = None


class KafkaSink(Sink):
    """Produces each value to ``topic`` with the source record's key and headers.

    Delivery reports arrive through ``producer.poll``/``flush``, which ``poll``, ``drain`` and
    a ``submit`` waiting on a full queue call. The engine calls the sink from its processing
    thread only (docs/architecture.md), but the sink is usable on its own (tests, the contract
    suite poll from a second thread), so the in-flight table keeps its lock: uncontended, cheap.
    """

    name = "kafka"

    def __init__(
        self,
        producer: ProducerLike,
        topic: str,
        encode: Callable[[Any], bytes | None] = encode_value,
    ) -> None:
        """``encode``: a value to bytes; a schema format's encoder (sinks.schema_encoding)."""
        super().__init__()
        self.producer = producer
        self.topic = topic
        self.encode = encode
        self._lock = threading.Lock()
        # Per source partition, so that abandon() can find what it must not report.
        self._in_flight: dict[TopicPartition, set[_InFlight]] = {}

    def submit(self, item: SinkItem) -> None:
        if not item.values:
            self.complete(item)
            return
        entry = _InFlight(item)
        tp = item.tp
        with self._lock:
            self._in_flight.setdefault(tp, set()).add(entry)

        def delivered(err: Any, _msg: Any) -> None:
            # Count under the lock: a caller outside the engine may poll from two threads.
            with self._lock:
                if err is not None and entry.error is None:
                    entry.error = SinkError(
                        f"record {item.record.where()}: delivery to {self.topic} failed: {err}"
                    )
                entry.remaining -= 1
                if entry.remaining > 0:
                    return
                if not self._remove_locked(tp, entry):
                    return  # abandoned: the engine no longer tracks this record
            self.complete(item, entry.error)

        headers = list(item.record.headers)
        try:
            for value in item.values:
                self._produce(self.encode(value), item, headers, delivered)
        except BaseException:
            # The engine gives up an item whose submit raised; reports of values already
            # sent must not complete it a second time.
            with self._lock:
                self._remove_locked(tp, entry)
            raise

    def _remove_locked(self, tp: TopicPartition, entry: _InFlight) -> bool:
        """Take an item off the in-flight table; False if it was not there (abandoned)."""
        mine = self._in_flight.get(tp)
        if mine is None or entry not in mine:
            return False
        mine.discard(entry)
        if not mine:
            del self._in_flight[tp]
        return True

    def _produce(
        self,
        payload: bytes | None,
        item: SinkItem,
        headers: list[tuple[str, bytes | None]],
        on_delivery: Any,
    ) -> None:
        produce_waiting(
            self.producer,
            self.topic,
            value=payload,
            key=item.record.key,
            headers=headers or None,
            on_delivery=on_delivery,
        )

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
            return sum(len(self._in_flight.pop(tp, ())) for tp in set(partitions))
