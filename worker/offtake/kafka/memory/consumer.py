"""The memory broker's consumer: ``confluent_kafka.Consumer``'s API and librdkafka's semantics.

Owns one consumer's subscription, its group membership, commits and the running of its
rebalance and commit callbacks; its assigned partitions (fetch positions, pause, stored
offsets, the fetch) are :mod:`offtake.kafka.memory.assignment`'s. Threading rule: the
consumer's state is guarded by the broker lock (``Cluster.cond``), as all broker state is; its
callbacks (``on_assign``, ``on_revoke``, ``on_lost``, ``on_commit``) run on the thread that
called ``consume()``/``poll()``/``close()``/``unsubscribe()``, always with the lock released. Like a
confluent-kafka consumer it has one owner: calls from two threads at once are not supported
(the engine's poll thread owns it; other threads only call :meth:`MemoryConsumer.close` after
the owner stopped).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Literal

from confluent_kafka import (
    OFFSET_INVALID,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from .assignment import Assignment
from .cluster import Cluster
from .coordinator import Member, RebalanceStep
from .errors import ClientKilled, kafka_error, raise_kafka
from .messages import (
    TP,
    MemoryMessage,
    RebalanceCallback,
    error_message,
    topic_partitions,
    tp_name,
)
from .settings import ConsumerSettings
from .timing import WAIT_SLICE, deadline_of, remaining

CommitResult = tuple[KafkaError | None, list[Any]]
_JOIN_RETRY = 1.0  # seconds between attempts to join a group that refused this consumer


class MemoryConsumer:
    """A consumer of the memory broker that behaves like ``confluent_kafka.Consumer``."""

    def __init__(self, cluster: Cluster, config: Mapping[str, Any]) -> None:
        self._cluster = cluster
        self._cond = cluster.cond
        conf = dict(config)
        self._on_commit: Callable[[Any, list[Any]], None] | None = conf.pop("on_commit", None)
        self._settings = ConsumerSettings.parse(conf)
        self._group_id = self._settings.group_id
        self._member: Member | None = None
        self._rejoin_at: float | None = None  # when to retry a join the group refused
        self._subscription: list[str] | None = None
        self._on_assign: RebalanceCallback | None = None
        self._on_revoke: RebalanceCallback | None = None
        self._on_lost: RebalanceCallback | None = None
        self._commit_results: deque[CommitResult] = deque()
        # Events for the application (errors, or left by the coordinator in the member's
        # mailbox), returned before records by the next consume().
        self._pending_errors: deque[MemoryMessage] = deque()
        # The assigned partitions: fetch positions, pause, stored offsets (assignment.py).
        self._assignment = Assignment(cluster, self._settings, self._pending_errors)
        self._rebalance_calls = 0  # (incremental_)(un)assign calls made by the app in a callback
        self._last_auto_commit = time.monotonic()
        self._closed = False
        self._killed = False

    # -- state checks ---------------------------------------------------------------------
    @property
    def _subscribed(self) -> bool:
        return self._subscription is not None

    def _check_open(self) -> None:
        if self._killed:
            raise ClientKilled("this consumer's worker was killed by the test harness")
        if self._closed:
            raise RuntimeError("Consumer closed")

    # -- subscription -------------------------------------------------------------------
    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        self._check_open()
        if not isinstance(topics, list):
            raise TypeError("expected list of topic unicode strings")
        for cb, name in ((on_assign, "on_assign"), (on_revoke, "on_revoke"), (on_lost, "on_lost")):
            if cb is not None and not callable(cb):
                raise TypeError(f"{name} expects a callable")
        with self._cond:
            self._on_assign, self._on_revoke, self._on_lost = on_assign, on_revoke, on_lost
            self._subscription = [str(t) for t in topics]
            for t in self._subscription:
                if not t.startswith("^") and t not in self._cluster.store:
                    # librdkafka reports a missing topic once, from consume(), and keeps
                    # the subscription: the topic is assigned once it exists.
                    self._pending_errors.append(
                        error_message(
                            kafka_error(
                                KafkaError.UNKNOWN_TOPIC_OR_PART,
                                f"Subscribed topic not available: {t}: "
                                "Broker: Unknown topic or partition",
                            ),
                            t,
                        )
                    )
            if self._member is not None and not self._member.lost:
                self._cluster.groups.resubscribe(self._member, self._subscription)
            else:
                self._member = self._join_locked(self._subscription)

    def _join_locked(self, topics: list[str]) -> Member | None:
        """Join the group; when refused, retry from consume() after a back-off, as librdkafka."""
        member = self._cluster.groups.join(self._settings, topics, self._pending_errors)
        self._rejoin_at = None if member is not None else time.monotonic() + _JOIN_RETRY
        return member

    def unsubscribe(self) -> None:
        """Leave the group; the revoke callback runs now, on this thread."""
        self._check_open()
        self._leave_group()
        with self._cond:
            self._subscription = None
            self._rejoin_at = None

    def memberid(self) -> str | None:
        self._check_open()
        with self._cond:
            m = self._member
            return m.member_id if m is not None and not m.lost else None

    # -- consuming ----------------------------------------------------------------------
    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        self._check_open()
        if not 0 <= num_messages <= 1_000_000:
            raise ValueError("num_messages must be between 0 and 1000000 (1M)")
        deadline = deadline_of(timeout)
        self._touch()
        try:
            while True:
                with self._cond:
                    self._check_open()
                    self._cluster.tick_locked()
                    results = list(self._commit_results)
                    self._commit_results.clear()
                    step = self._next_step_locked()
                    if step is None and not results:
                        out: list[Any] = list(self._pending_errors)
                        self._pending_errors.clear()
                        out.extend(self._assignment.fetch_locked(num_messages - len(out)))
                        self._maybe_auto_commit_locked()
                        if out or num_messages == 0:
                            return out
                        wait = remaining(deadline)
                        if wait <= 0:
                            return []
                        self._set_waiting(True)
                        try:
                            self._cond.wait(min(wait, WAIT_SLICE))
                        finally:
                            self._set_waiting(False)
                        continue
                # Callbacks run without the lock, on this thread, as librdkafka serves them.
                self._serve_commit_results(results)
                if step is not None:
                    self._run_rebalance(*step)
        finally:
            self._touch()

    def _next_step_locked(self) -> RebalanceStep | None:
        member = self._member
        if member is None:
            if (
                self._rejoin_at is not None
                and self._subscription is not None
                and time.monotonic() >= self._rejoin_at
            ):
                self._member = self._join_locked(self._subscription)
            return None
        if member.lost:
            return ("lost", sorted(self._assignment.fetches))
        return self._cluster.groups.next_step(member)

    def poll(self, timeout: float = -1) -> Any:
        msgs = self.consume(1, timeout)
        return msgs[0] if msgs else None

    def _touch(self) -> None:
        with self._cond:
            if self._member is not None:
                self._member.last_poll = time.monotonic()

    def _set_waiting(self, waiting: bool) -> None:
        if self._member is not None:
            self._member.waiting = waiting
            self._member.last_poll = time.monotonic()

    # -- rebalance callbacks --------------------------------------------------------------
    def _run_rebalance(
        self,
        kind: Literal["assign", "revoke", "lost"],
        parts: list[TP],
        *,
        rejoin: bool = True,
        release: bool = True,
    ) -> None:
        """Run one rebalance callback, then sync the assignment like confluent-kafka does."""
        cooperative = self._cluster.groups.groups[self._group_id].protocol == "cooperative"
        tps = topic_partitions(parts)
        if kind == "assign":
            cb = self._on_assign
        elif kind == "lost":
            cb = self._on_lost or self._on_revoke
        else:
            cb = self._on_revoke
            if self._settings.auto_commit:  # librdkafka commits stored offsets before a revoke
                with self._cond:
                    self._auto_commit_locked(set(parts))
        self._rebalance_calls = 0
        try:
            if cb is not None and (parts or kind == "assign"):
                cb(self, tps)
        finally:
            # confluent-kafka calls (incremental_)assign/unassign itself when the callback
            # did not, even if it raised.
            if self._rebalance_calls == 0 and not self._killed:
                if kind == "assign":
                    if cooperative:
                        self._incremental_assign_impl(tps)
                    else:
                        self._assign_impl(tps)
                elif cooperative:
                    self._incremental_unassign_impl(tps, strict=False)
                else:
                    self._unassign_impl()
            with self._cond:
                member = self._member
                if member is not None and not self._killed:
                    if kind == "revoke" and release:
                        self._cluster.groups.revoked(member, parts, rejoin=rejoin)
                    elif (
                        kind == "lost"
                        and rejoin
                        and not member.fenced
                        and self._subscription is not None
                    ):
                        # librdkafka rejoins the group after a lost assignment (but a fenced
                        # static member is done: that error is fatal).
                        self._member = self._join_locked(self._subscription)
                    elif kind == "lost":
                        self._member = None

    def _leave_group(self, closing: bool = False) -> None:
        """Revoke (or lose) everything through the callbacks, commit if automatic, leave.

        A static member (group.instance.id) that closes revokes locally but does not leave
        (KIP-345, librdkafka): the group keeps its partitions for it until
        session.timeout.ms, so nobody else consumes them meanwhile.
        """
        with self._cond:
            member = self._member
            if member is None:
                return
            parts = sorted(member.owned) if not member.lost else sorted(self._assignment.fetches)
            kind: Literal["lost", "revoke"] = "lost" if member.lost else "revoke"
            static = closing and member.instance_id is not None
        try:
            if parts:
                self._run_rebalance(kind, parts, rejoin=False, release=not static)
        finally:
            # Leave even when the callback raised: a member that stays in the group without
            # polling would block its partitions until max.poll.interval.ms.
            with self._cond:
                if member.lost:
                    pass
                elif static:
                    self._cluster.groups.depart(member)
                else:
                    self._cluster.groups.leave(member)
                self._member = None

    # -- assignment ---------------------------------------------------------------------
    def _check_protocol(self, incremental: bool) -> None:
        with self._cond:
            g = self._cluster.groups.groups.get(self._group_id)
            protocol = g.protocol if (g is not None and self._subscribed) else None
        if protocol == "cooperative" and not incremental:
            raise_kafka(
                KafkaError._STATE,
                "Changes to the current assignment must be made using incremental_assign() or "
                "incremental_unassign() when rebalance protocol type is COOPERATIVE",
            )
        if protocol == "eager" and incremental:
            raise_kafka(
                KafkaError._STATE,
                "Changes to the current assignment must be made using assign() when rebalance "
                "protocol type is EAGER",
            )

    def _assign_impl(self, partitions: list[Any]) -> None:
        with self._cond:
            self._assignment.assign_locked(partitions)
            self._cond.notify_all()

    def _unassign_impl(self) -> None:
        with self._cond:
            self._assignment.clear_locked()

    def _incremental_assign_impl(self, partitions: list[Any]) -> None:
        with self._cond:
            self._assignment.incremental_assign_locked(partitions)
            self._cond.notify_all()

    def _incremental_unassign_impl(self, partitions: list[Any], strict: bool = True) -> None:
        with self._cond:
            self._assignment.incremental_unassign_locked(partitions, strict)

    def assign(self, partitions: list[Any]) -> None:
        self._check_open()
        self._check_protocol(incremental=False)
        self._rebalance_calls += 1
        self._assign_impl(partitions)

    def unassign(self) -> None:
        self._check_open()
        self._check_protocol(incremental=False)
        self._rebalance_calls += 1
        self._unassign_impl()

    def incremental_assign(self, partitions: list[Any]) -> None:
        self._check_open()
        self._check_protocol(incremental=True)
        self._rebalance_calls += 1
        self._incremental_assign_impl(partitions)

    def incremental_unassign(self, partitions: list[Any]) -> None:
        self._check_open()
        self._check_protocol(incremental=True)
        self._rebalance_calls += 1
        self._incremental_unassign_impl(partitions)

    def assignment(self) -> list[Any]:
        self._check_open()
        with self._cond:
            return topic_partitions(self._assignment.fetches)

    def pause(self, partitions: list[Any]) -> None:
        """Stop returning records of these partitions; unassigned ones are ignored."""
        self._check_open()
        with self._cond:
            self._assignment.set_paused_locked(partitions, True)

    def resume(self, partitions: list[Any]) -> None:
        self._check_open()
        with self._cond:
            self._assignment.set_paused_locked(partitions, False)
            self._cond.notify_all()

    def seek(self, partition: Any) -> None:
        self._check_open()
        with self._cond:
            self._assignment.seek_locked(partition)
            self._cond.notify_all()

    def position(self, partitions: list[Any]) -> list[Any]:
        """One past the last record returned per partition; OFFSET_INVALID before the first.

        As in librdkafka, this is not where an assigned partition will start fetching: that
        position (committed offset or auto.offset.reset) is not visible to the application.
        """
        self._check_open()
        with self._cond:
            out = []
            for tp in partitions:
                pos = self._assignment.app_position_locked((tp.topic, tp.partition))
                out.append(
                    TopicPartition(tp.topic, tp.partition, OFFSET_INVALID if pos is None else pos)
                )
            return out

    # -- offsets ------------------------------------------------------------------------
    def store_offsets(self, message: Any = None, offsets: list[Any] | None = None) -> None:
        self._check_open()
        if message is not None and offsets is not None:
            raise ValueError("message and offsets are mutually exclusive")
        if message is None and offsets is None:
            raise ValueError("expected either message or offsets")
        entries = self._offsets_from(message, offsets)
        with self._cond:
            for t, p, o in entries:
                if (t, p) not in self._assignment:
                    raise_kafka(
                        KafkaError._STATE,
                        f"StoreOffsets failed: {t}[{p}] is not assigned to this consumer",
                    )
                self._assignment.stored[(t, p)] = o

    def _offsets_from(self, message: Any, offsets: list[Any] | None) -> list[tuple[str, int, int]]:
        if offsets is not None:
            return [(tp.topic, tp.partition, tp.offset) for tp in offsets]
        if message.error() is not None:
            raise_kafka(
                KafkaError._INVALID_ARG,
                f"Cannot commit offsets for message with error: '{message.error().str()}'",
            )
        return [(message.topic(), message.partition(), message.offset() + 1)]

    def _commit_locked(self, offsets: list[tuple[str, int, int]]) -> KafkaError | None:
        return self._cluster.groups.commit(self._group_id, self._member, self._subscribed, offsets)

    def commit(
        self, message: Any = None, offsets: list[Any] | None = None, asynchronous: bool = True
    ) -> list[Any] | None:
        self._check_open()
        if message is not None and offsets is not None:
            raise ValueError("message and offsets are mutually exclusive")
        if message is not None or offsets is not None:
            entries = self._offsets_from(message, offsets)
        else:
            with self._cond:
                entries = [
                    (t, p, o)
                    for (t, p), o in self._assignment.stored.items()
                    if (t, p) in self._assignment
                ]
        # Logical offsets (negative) are not committed, as in librdkafka.
        valid = [(t, p, o) for t, p, o in entries if o >= 0]
        with self._cond:
            self._check_open()
            if valid:
                err = self._commit_locked(valid)
            else:
                err = kafka_error(KafkaError._NO_OFFSET, "Local: No offset stored")
            result = [TopicPartition(t, p, o) for t, p, o in valid]
            if asynchronous:
                if self._on_commit is not None:
                    self._commit_results.append((err, result))
                    self._cond.notify_all()
                return None
        if err is not None:
            raise KafkaException(err)
        return result

    def _auto_commit_locked(self, parts: set[TP] | None = None) -> None:
        member = self._member
        if member is None or member.lost:
            return
        committed = self._cluster.groups.committed(self._group_id)
        offsets = [
            (t, p, o)
            for (t, p), o in self._assignment.stored.items()
            if (t, p) in member.owned
            and (parts is None or (t, p) in parts)
            and committed.get((t, p)) != o
        ]
        if offsets:
            err = self._commit_locked(offsets)
            if self._on_commit is not None:
                self._commit_results.append((err, [TopicPartition(t, p, o) for t, p, o in offsets]))
        self._last_auto_commit = time.monotonic()

    def _maybe_auto_commit_locked(self) -> None:
        if (
            self._settings.auto_commit
            and time.monotonic() - self._last_auto_commit >= self._settings.auto_commit_interval
        ):
            self._auto_commit_locked()

    def _serve_commit_results(self, results: list[CommitResult]) -> None:
        if self._on_commit is None:
            return
        for err, tps in results:
            self._on_commit(err, tps)

    def committed(self, partitions: list[Any], timeout: float | None = None) -> list[Any]:
        self._check_open()
        with self._cond:
            stored = self._cluster.groups.committed(self._group_id)
            return [
                TopicPartition(
                    tp.topic, tp.partition, stored.get((tp.topic, tp.partition), OFFSET_INVALID)
                )
                for tp in partitions
            ]

    def get_watermark_offsets(
        self, partition: Any, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int] | None:
        self._check_open()
        key = (partition.topic, partition.partition)
        with self._cond:
            self._cluster.tick_locked()
            log_ = self._cluster.store.log(*key)
            if log_ is None:
                if cached:
                    return (OFFSET_INVALID, OFFSET_INVALID)
                raise_kafka(
                    KafkaError.UNKNOWN_TOPIC_OR_PART,
                    f"Failed to get watermark offsets: {tp_name(key)} does not exist",
                )
            if cached and key not in self._assignment:
                # librdkafka only caches watermarks of partitions it fetches.
                return (OFFSET_INVALID, OFFSET_INVALID)
            return (0, len(log_))

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self._check_open()
        return self._cluster.metadata(topic)

    # -- shutdown -------------------------------------------------------------------------
    def close(self) -> None:
        """Revoke through the callbacks, commit if automatic, leave the group, close."""
        if self._killed:
            raise ClientKilled("this consumer's worker was killed by the test harness")
        if self._closed:
            return
        try:
            self._leave_group(closing=True)
            with self._cond:
                results = list(self._commit_results)
                self._commit_results.clear()
            self._serve_commit_results(results)
        finally:
            with self._cond:
                self._closed = True
                self._assignment.fetches = {}
                self._cond.notify_all()

    def __enter__(self) -> MemoryConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._closed and not self._killed:
            self.close()

    def _kill(self) -> None:
        """SIGKILL: no revoke, no commit, no leave.

        The broker expels a dynamic member at once (the harness stands in for the session
        timeout); a static member keeps its partitions until session.timeout.ms.
        """
        with self._cond:
            self._killed = True
            member = self._member
            if member is not None and not member.lost:
                if member.instance_id is not None:
                    self._cluster.groups.depart(member)
                else:
                    self._cluster.groups.expel(member, "worker killed")
            self._commit_results.clear()
            self._cond.notify_all()
