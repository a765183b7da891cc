"""A share consumer of the memory broker that behaves like ``confluent_kafka.ShareConsumer``.

Owns one member of a share group (:mod:`.share_groups`): its subscription, the records of its
last poll and the acknowledgements recorded and not yet sent. As confluent-kafka 2.16 does,
in explicit mode a poll before every record of the previous one is acknowledged raises
IllegalStateException; acknowledgements are sent by the next poll, commit_sync or commit_async,
and their results reach the acknowledgement-commit callback on the calling thread. The broker
lock is never held while that callback runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import IllegalStateException, KafkaError, KafkaException, TopicPartition

from .cluster import Cluster
from .errors import ClientKilled, kafka_error
from .messages import TP, MemoryMessage
from .timing import WAIT_SLICE, deadline_of, remaining

AckCallback = Callable[[dict[Any, set[int]], Any], None]
_MAX_POLL_RECORDS = 500  # librdkafka's max.poll.records default


class MemoryShareConsumer:
    """See the module docstring."""

    def __init__(self, cluster: Cluster, config: Mapping[str, Any]) -> None:
        self._cluster = cluster
        self._cond = cluster.cond
        self._group = str(config["group.id"])
        self._explicit = config.get("share.acknowledgement.mode", "implicit") == "explicit"
        self._max_records = int(config.get("max.poll.records", _MAX_POLL_RECORDS))
        self._member: int | None = None
        self._last: dict[tuple[TP, int], MemoryMessage] = {}  # the last poll, unacknowledged
        self._pending: list[tuple[TP, int, int]] = []  # acknowledged here, not sent
        self._callback: AckCallback | None = None
        self._closed = False
        self._killed = False

    def _check_open(self) -> None:
        if self._killed:
            raise ClientKilled("this share consumer's worker was killed by the test harness")
        if self._closed:
            raise IllegalStateException("Share consumer is closed")

    def subscribe(self, topics: list[str]) -> None:
        self._check_open()
        with self._cond:
            if self._member is not None:
                self._cluster.shares.leave(self._group, self._member)
            self._member = self._cluster.shares.join(self._group, frozenset(topics))

    def set_acknowledgement_commit_callback(self, callback: AckCallback | None) -> None:
        self._callback = callback

    def poll(self, timeout: float = -1) -> list[MemoryMessage]:
        self._check_open()
        if self._member is None:
            raise IllegalStateException("Share consumer is not subscribed to any topic")
        if self._explicit and self._last:
            raise IllegalStateException(
                f"{len(self._last)} records from previous poll have not been acknowledged"
            )
        if not self._explicit:
            for tp, offset in list(self._last):
                self.acknowledge_offset(tp[0], tp[1], offset)
        self._send()
        deadline = deadline_of(timeout)
        while True:
            with self._cond:
                self._check_open()
                self._cluster.tick_locked()
                got = self._cluster.shares.acquire(
                    self._group, self._member, self._max_records, time.monotonic()
                )
                if got or remaining(deadline) <= 0:
                    break
                self._cond.wait(min(remaining(deadline), WAIT_SLICE))
        out = []
        for a in got:
            msg = MemoryMessage(
                a.tp[0],
                a.tp[1],
                a.offset,
                a.entry.key,
                a.entry.value,
                a.entry.headers,
                a.entry.timestamp,
                delivery_count=a.delivery_count,
            )
            self._last[(a.tp, a.offset)] = msg
            out.append(msg)
        return out

    def acknowledge(self, message: Any, ack_type: int = 1) -> None:
        self.acknowledge_offset(message.topic(), message.partition(), message.offset(), ack_type)

    def acknowledge_offset(
        self, topic: str, partition: int, offset: int, ack_type: int = 1
    ) -> None:
        self._check_open()
        if int(ack_type) not in (1, 2, 3):
            raise ValueError(f"invalid acknowledgement type {ack_type!r}")
        if self._last.pop(((topic, partition), offset), None) is None:
            raise IllegalStateException(f"{topic} [{partition}] offset {offset} is not in flight")
        self._pending.append(((topic, partition), offset, int(ack_type)))

    def commit_async(self) -> None:
        self._check_open()
        self._send()

    def commit_sync(self, timeout: float = 60) -> dict[Any, Any]:
        self._check_open()
        return self._send()

    def close(self) -> None:
        if self._closed or self._killed:
            return
        self._send()
        with self._cond:
            if self._member is not None:
                self._cluster.shares.leave(self._group, self._member)
            self._cond.notify_all()
        self._closed = True

    def _kill(self) -> None:
        """SIGKILL: nothing is sent or released; the records' locks expire on the broker."""
        self._killed = True

    def _send(self) -> dict[Any, Any]:
        """Send the pending acknowledgements; the callback hears of each partition's result."""
        if not self._pending:
            return {}
        pending, self._pending = self._pending, []
        done: dict[TP, set[int]] = {}
        refused: dict[TP, set[int]] = {}
        with self._cond:
            assert self._member is not None
            for tp, offset, kind in pending:
                ok = self._cluster.shares.acknowledge(self._group, self._member, tp, offset, kind)
                (done if ok else refused).setdefault(tp, set()).add(offset)
            self._cond.notify_all()
        error = kafka_error(KafkaError.INVALID_RECORD_STATE, "Broker: The record state is invalid")
        result: dict[Any, Any] = {}
        for tp in {*done, *refused}:
            result[TopicPartition(*tp)] = KafkaException(error) if tp in refused else None
        if self._callback is not None:
            if done:
                self._callback({TopicPartition(*tp): o for tp, o in done.items()}, None)
            if refused:
                self._callback(
                    {TopicPartition(*tp): o for tp, o in refused.items()}, KafkaException(error)
                )
        return result
