"""The Kafka sink: an idempotent producer; an item is done when every delivery report is in."""

from __future__ import annotations

import threading
from collections.abc import Collection
from typing import Any

from offtake.kafka.produce import produce_waiting
from offtake.kafka.protocols import ProducerLike
from offtake.records import TopicPartition
from offtake.sinks.base import Sink, SinkError, SinkItem
from offtake.sinks.encoding import encode_value


class KafkaSink(Sink):
    """Produces each value to ``topic`` with the source record's key and headers."""

    name = "kafka"

    def __init__(self, producer: ProducerLike, topic: str) -> None:
        super().__init__()
        self.producer = producer
        self.topic = topic
        self._pending = 0
        self._lock = threading.Lock()

    def submit(self, item: SinkItem) -> None:
        if not item.values:
            self.complete(item)
            return
        remaining = [len(item.values)]
        failed: list[BaseException] = []

        def delivered(err: Any, _msg: Any) -> None:
            # librdkafka calls this from whichever thread polls the producer.
            if err is not None:
                failed.append(
                    SinkError(
                        f"record {item.record.where()}: delivery to {self.topic} failed: {err}"
                    )
                )
            remaining[0] -= 1
            if remaining[0] == 0:
                with self._lock:
                    self._pending -= 1
                self.complete(item, failed[0] if failed else None)

        with self._lock:
            self._pending += 1
        headers = list(item.record.headers)
        for value in item.values:
            self._produce(encode_value(value), item, headers, delivered)

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

    def pending(self) -> int:
        return self._pending
