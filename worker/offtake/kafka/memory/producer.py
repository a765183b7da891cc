"""The memory broker's producer: ``confluent_kafka.Producer``'s API and delivery reports.

Owns one producer's queue of unreported deliveries (its :class:`~.faults.Outbox`) and the
running of its delivery callbacks. Threading rule: its state is guarded by the broker lock
(``Cluster.cond``); delivery callbacks run on the thread that calls :meth:`poll` or
:meth:`flush`, with the lock released. ``produce()`` may be called from any thread, as with
confluent-kafka.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError

from .cluster import Cluster
from .errors import ClientKilled, kafka_error, raise_kafka
from .faults import Delivery, Outbox
from .messages import DeliveryCallback, Entry, normalise_headers, to_bytes
from .settings import conf_ms
from .timing import WAIT_SLICE, deadline_of, now_ms, remaining


class MemoryProducer:
    """A producer to the memory broker that behaves like ``confluent_kafka.Producer``."""

    def __init__(self, cluster: Cluster, config: Mapping[str, Any]) -> None:
        self._cluster = cluster
        self._cond = cluster.cond
        self._default_callback: DeliveryCallback | None = config.get("on_delivery")
        timeout_key = (
            "delivery.timeout.ms" if "delivery.timeout.ms" in config else "message.timeout.ms"
        )
        self._message_timeout = conf_ms(config, timeout_key, 300_000)
        self._max_queue = int(config.get("queue.buffering.max.messages", 100_000))
        self._outstanding = 0  # produced and not yet reported to the app
        self._outbox = Outbox(self._cond)
        self._missing: set[str] = set()  # topics metadata said do not exist

    def _check_open(self) -> None:
        if self._outbox.killed:
            raise ClientKilled("this producer's worker was killed by the test harness")

    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Any = None,
        callback: DeliveryCallback | None = None,
    ) -> None:
        self._check_open()
        entry = Entry(
            to_bytes(key, "key"),
            to_bytes(value, "value"),
            normalise_headers(headers),
            timestamp or now_ms(),
        )
        cb = on_delivery or callback or self._default_callback
        cluster = self._cluster
        with self._cond:
            if self._outstanding >= self._max_queue:
                raise BufferError("Local: Queue full")
            cluster.tick_locked()
            if topic not in cluster.store:
                if not cluster.auto_create:
                    self._unknown_topic_locked(topic, entry, partition, cb)
                    return
                cluster.create_topic_locked(topic, cluster.default_partitions)
            self._missing.discard(topic)
            p = cluster.store.choose_partition(topic, entry.key, partition)
            d = Delivery(
                self._outbox, topic, p, entry, cb, time.monotonic() + self._message_timeout
            )
            self._outstanding += 1
            if not cluster.faults.intercept(d):
                d.offset = cluster.append_locked(topic, p, entry)
                self._outbox.put(d)

    def _unknown_topic_locked(
        self, topic: str, entry: Entry, partition: int, cb: DeliveryCallback | None
    ) -> None:
        """As librdkafka: the first record fails delivery once metadata says the topic does
        not exist; produce() raises for later ones, the topic now known to be missing."""
        if topic in self._missing:
            raise_kafka(
                KafkaError._UNKNOWN_TOPIC, "Unable to produce message: Local: Unknown topic"
            )
        self._missing.add(topic)
        d = Delivery(self._outbox, topic, partition, entry, cb, time.monotonic())
        d.error = kafka_error(
            KafkaError.UNKNOWN_TOPIC_OR_PART, "Broker: Unknown topic or partition"
        )
        self._outstanding += 1
        self._outbox.put(d)

    def poll(self, timeout: float = -1) -> int:
        """Serve delivery callbacks; waits up to ``timeout`` for one. Returns how many ran."""
        self._check_open()
        deadline = deadline_of(timeout)
        while True:
            with self._cond:
                self._check_open()
                self._cluster.tick_locked()
                ready = list(self._outbox.ready)
                self._outbox.ready.clear()
                if not ready:
                    wait = remaining(deadline)
                    if wait <= 0:
                        return 0
                    self._cond.wait(min(wait, WAIT_SLICE))
                    continue
            self._serve(ready)
            return len(ready)

    def _serve(self, ready: list[Delivery]) -> None:
        for i, d in enumerate(ready):
            with self._cond:
                self._outstanding -= 1
            if d.callback is None:
                continue
            try:
                d.callback(d.error, d.report())
            except BaseException:
                # The exception propagates from poll()/flush() like confluent-kafka's; the
                # reports not yet served stay queued for the next call.
                with self._cond:
                    self._outbox.ready.extendleft(reversed(ready[i + 1 :]))
                raise

    def flush(self, timeout: float = -1) -> int:
        """Wait until every message is reported (or the timeout); returns how many are left."""
        self._check_open()
        deadline = deadline_of(timeout)
        while True:
            self.poll(0)
            with self._cond:
                if self._outstanding == 0:
                    return 0
                wait = remaining(deadline)
                if wait <= 0:
                    return self._outstanding
                if not self._outbox.ready:
                    self._cond.wait(min(wait, WAIT_SLICE))

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        """Fail undelivered (stalled) messages with ``_PURGE_QUEUE``; served by poll()."""
        self._check_open()
        with self._cond:
            if in_queue:
                self._cluster.faults.purge(self._outbox)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self._check_open()
        return self._cluster.metadata(topic)

    def __len__(self) -> int:
        self._check_open()
        with self._cond:
            self._cluster.tick_locked()
            return self._outstanding

    def _kill(self) -> None:
        """SIGKILL: messages not yet written are gone, reports are never served."""
        with self._cond:
            self._outbox.killed = True
            self._cluster.faults.drop(self._outbox)
            self._outbox.ready.clear()
            self._cond.notify_all()
