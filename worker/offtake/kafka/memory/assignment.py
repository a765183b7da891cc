"""One memory consumer's assigned partitions: where each fetches from, and the fetch itself.

Owns, per assigned partition, the fetch position (from an offset, the group's committed
offset or ``auto.offset.reset``), the pause flag, the position the application sees and the
offset stored for the next commit; assigning and unassigning them (eagerly, all at once, or
incrementally), pausing, seeking, and taking the next records of the unpaused ones in turn.
:class:`~offtake.kafka.memory.consumer.MemoryConsumer` is its one user: it checks the
arguments and the rebalance protocol, and holds the broker lock (``Cluster.cond``) around
every call here (the ``_locked`` suffix), as it does for all broker state.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, OFFSET_INVALID, KafkaError

from .cluster import Cluster
from .errors import kafka_error, raise_kafka
from .messages import TP, MemoryMessage, error_message, message_of, tp_name
from .settings import ConsumerSettings


@dataclass
class Fetch:
    position: int | None  # next offset to fetch; None: auto.offset.reset=error, no commit
    paused: bool = False
    eof_sent: bool = False
    # What position() reports: one past the last record returned to the application. Like
    # librdkafka's, it is unknown (OFFSET_INVALID) after an assign or a seek until a record
    # of the partition has been returned, even though the fetch position is known.
    app_position: int | None = None


class Assignment:
    """The consumer's assigned partitions (see the module's docstring); every method runs
    under the broker lock."""

    def __init__(
        self,
        cluster: Cluster,
        settings: ConsumerSettings,
        pending_errors: deque[MemoryMessage],
    ) -> None:
        self._cluster = cluster
        self._settings = settings
        # The consumer's: events for the application, returned before records by consume().
        self._pending_errors = pending_errors
        self.fetches: dict[TP, Fetch] = {}
        self.stored: dict[TP, int] = {}  # offsets stored for the next commit
        self._rotation = 0

    def __contains__(self, tp: object) -> bool:
        return tp in self.fetches

    def start_position_locked(self, tp: TP, offset: int) -> int | None:
        if offset >= 0:
            return offset
        if offset == OFFSET_BEGINNING:
            return 0
        high = self._cluster.store.high_watermark(*tp)
        if offset == OFFSET_END:
            return high
        committed = self._cluster.groups.group(self._settings.group_id).committed.get(tp)
        if committed is not None:
            return committed
        if self._settings.reset == "earliest":
            return 0
        if self._settings.reset == "latest":
            return high
        self._pending_errors.append(
            error_message(
                kafka_error(
                    KafkaError._AUTO_OFFSET_RESET,
                    f"no committed offset for {tp_name(tp)} and auto.offset.reset=error",
                ),
                tp[0],
                tp[1],
                OFFSET_INVALID,
            )
        )
        return None

    def assign_locked(self, partitions: list[Any]) -> None:
        self.fetches = {}
        self.stored = {}
        for tp in partitions:
            key = (tp.topic, tp.partition)
            self.fetches[key] = Fetch(self.start_position_locked(key, tp.offset))

    def clear_locked(self) -> None:
        self.fetches = {}
        self.stored = {}

    def incremental_assign_locked(self, partitions: list[Any]) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        dup = [k for k in keys if k in self.fetches]
        if dup:
            raise_kafka(
                KafkaError._CONFLICT,
                f"{tp_name(dup[0])} is already part of the current assignment",
            )
        for tp, key in zip(partitions, keys, strict=True):
            self.fetches[key] = Fetch(self.start_position_locked(key, tp.offset))

    def incremental_unassign_locked(self, partitions: list[Any], strict: bool) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        missing = [k for k in keys if k not in self.fetches]
        if missing and strict:
            raise_kafka(
                KafkaError._INVALID_ARG,
                f"{tp_name(missing[0])} is not part of the current assignment",
            )
        for key in keys:
            self.fetches.pop(key, None)
            self.stored.pop(key, None)

    def set_paused_locked(self, partitions: list[Any], paused: bool) -> None:
        """Pause or resume these partitions; unassigned ones are ignored."""
        for tp in partitions:
            f = self.fetches.get((tp.topic, tp.partition))
            if f is not None:
                f.paused = paused

    def seek_locked(self, partition: Any) -> None:
        key = (partition.topic, partition.partition)
        f = self.fetches.get(key)
        if f is None:
            raise_kafka(
                KafkaError._STATE,
                f"Failed to seek: {tp_name(key)} is not assigned to this consumer",
            )
        f.position = self.start_position_locked(key, partition.offset)
        f.app_position = None
        f.eof_sent = False

    def app_position_locked(self, tp: TP) -> int | None:
        f = self.fetches.get(tp)
        return f.app_position if f is not None else None

    def fetch_locked(self, limit: int) -> list[MemoryMessage]:
        out: list[MemoryMessage] = []
        if limit <= 0:
            return out
        parts = sorted(tp for tp, f in self.fetches.items() if not f.paused)
        if not parts:
            return out
        # Start at a rotating partition so that no partition starves the others.
        self._rotation = (self._rotation + 1) % len(parts)
        for tp in parts[self._rotation :] + parts[: self._rotation]:
            log_ = self._cluster.store.log(*tp)
            if log_ is None:
                continue
            f = self.fetches[tp]
            if f.position is None:
                continue
            if f.position > len(log_):  # out of range: reset, as librdkafka does
                f.position = 0 if self._settings.reset == "earliest" else len(log_)
            while f.position < len(log_) and len(out) < limit:
                out.append(message_of(tp[0], tp[1], f.position, log_[f.position]))
                f.position += 1
                f.app_position = f.position
                f.eof_sent = False
                if self._settings.auto_store:
                    self.stored[tp] = f.position
            if (
                self._settings.partition_eof
                and f.position == len(log_)
                and not f.eof_sent
                and len(out) < limit
            ):
                f.eof_sent = True
                out.append(
                    error_message(
                        kafka_error(
                            KafkaError._PARTITION_EOF, f"Broker: No more messages ({tp_name(tp)})"
                        ),
                        tp[0],
                        tp[1],
                        f.position,
                    )
                )
            if len(out) >= limit:
                break
        return out
