"""The memory broker's public face: the admin and test API, and client factories.

Owns :class:`MemoryBroker`: create topics and partitions, produce and read records directly,
inspect and seed group state, inject faults, and hand out :class:`~.clients.MemoryClients`.
Every method takes the broker lock (``Cluster.cond``) for its whole body and never calls
application code, so any thread may call any of them at any time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError

from .clients import MemoryClients
from .cluster import Cluster
from .coordinator import GroupEvent
from .errors import kafka_error
from .messages import TP, Entry, MemoryMessage, encode_any, message_of, normalise_headers
from .timing import now_ms


class MemoryBroker:
    """Topics, consumer groups and committed offsets in memory; see :mod:`offtake.kafka.memory`.

    ``auto_create_topics`` mirrors the broker setting of the same name: producing to, or
    assigning, an unknown topic creates it with ``default_partitions`` partitions.
    """

    def __init__(self, *, auto_create_topics: bool = True, default_partitions: int = 1) -> None:
        self._cluster = Cluster(
            auto_create_topics=auto_create_topics, default_partitions=default_partitions
        )
        self._cond = self._cluster.cond

    # -- topics -----------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create a topic; a no-op if it exists with that many partitions."""
        if partitions < 1:
            raise ValueError(f"topic {name!r}: partitions must be at least 1, got {partitions}")
        with self._cond:
            existing = self._cluster.store.get(name)
            if existing is not None:
                if len(existing) != partitions:
                    raise ValueError(
                        f"topic {name!r} exists with {len(existing)} partitions, not {partitions}; "
                        "use create_partitions() to add partitions"
                    )
                return
            self._cluster.create_topic_locked(name, partitions)

    def create_partitions(self, name: str, total: int) -> None:
        """Grow a topic to ``total`` partitions, rebalancing the groups that read it."""
        with self._cond:
            self._cluster.grow_topic_locked(name, total)

    def topics(self) -> dict[str, int]:
        """Topic names and their partition counts."""
        with self._cond:
            return self._cluster.store.counts()

    # -- records ----------------------------------------------------------------------------
    def produce(
        self,
        topic: str,
        value: Any,
        key: Any = None,
        partition: int | None = None,
        headers: Any = None,
        timestamp: int | None = None,
    ) -> MemoryMessage:
        """Append one record right away (no stall or failure hook applies); returns it.

        ``value`` and ``key`` may be bytes, str (UTF-8) or None; for convenience ``value``
        may also be any JSON-serialisable object, written as compact JSON.
        """
        entry = Entry(
            encode_any(key) if not isinstance(key, bytes) else key,
            encode_any(value),
            normalise_headers(headers),
            now_ms() if timestamp is None else timestamp,
        )
        cluster = self._cluster
        with self._cond:
            if topic not in cluster.store:
                cluster.create_topic_locked(topic, cluster.default_partitions)
            p = cluster.store.choose_partition(
                topic, entry.key, -1 if partition is None else partition
            )
            offset = cluster.append_locked(topic, p, entry)
        return message_of(topic, p, offset, entry)

    def records(self, topic: str) -> list[MemoryMessage]:
        """Every record of a topic, in partition then offset order."""
        with self._cond:
            self._cluster.tick_locked()
            parts = self._cluster.store.partitions(topic)
            return [
                message_of(topic, p, o, e)
                for p, log_ in enumerate(parts)
                for o, e in enumerate(log_)
            ]

    def end_offsets(self, topic: str) -> dict[int, int]:
        """The log-end offset (high watermark) of each partition."""
        with self._cond:
            self._cluster.tick_locked()
            return {p: len(log_) for p, log_ in enumerate(self._cluster.store.partitions(topic))}

    # -- groups -----------------------------------------------------------------------------
    def committed(self, group: str, topic: str, partition: int) -> int | None:
        """The group's committed offset of a partition, None when it never committed."""
        with self._cond:
            return self._cluster.groups.committed(group).get((topic, partition))

    def set_committed(self, group: str, topic: str, partition: int, offset: int) -> None:
        """Store a committed offset as an admin would (rewind, or seed a test)."""
        with self._cond:
            self._cluster.groups.group(group).committed[(topic, partition)] = offset
            self._cond.notify_all()

    def lag(self, group: str, topics: Iterable[str] | None = None) -> dict[TP, int]:
        """Log-end minus committed offset per partition (the whole log when nothing committed)."""
        with self._cond:
            self._cluster.tick_locked()
            committed = self._cluster.groups.committed(group)
            store = self._cluster.store
            names = list(topics) if topics is not None else list(store.counts())
            out: dict[TP, int] = {}
            for name in names:
                for p, log_ in enumerate(store.partitions(name)):
                    out[(name, p)] = max(0, len(log_) - committed.get((name, p), 0))
            return out

    def members(self, group: str) -> list[str]:
        """Member ids of a group, in join order."""
        with self._cond:
            g = self._cluster.groups.groups.get(group)
            return list(g.members) if g else []

    def assignment(self, group: str) -> dict[str, list[TP]]:
        """What each member owns now (what it was told through on_assign and not yet revoked)."""
        with self._cond:
            g = self._cluster.groups.groups.get(group)
            if g is None:
                return {}
            return {m: sorted(member.owned) for m, member in g.members.items()}

    def generation(self, group: str) -> int:
        with self._cond:
            g = self._cluster.groups.groups.get(group)
            return g.generation if g else 0

    def events(self, group: str | None = None) -> list[GroupEvent]:
        """Group events in the order they happened (see :class:`GroupEvent`)."""
        with self._cond:
            return [e for e in self._cluster.groups.events if group is None or e.group == group]

    @property
    def rejected_commits(self) -> list[str]:
        """Why each rejected commit was rejected; a correct engine leaves this empty."""
        with self._cond:
            return list(self._cluster.groups.rejected)

    # -- test hooks -------------------------------------------------------------------------
    def fail_produce(self, topic: str, n: int = 1, error: KafkaError | None = None) -> None:
        """Make the next ``n`` produce() calls to ``topic`` fail delivery (nothing is written).

        The default error is a retriable ``_MSG_TIMED_OUT``, what librdkafka reports when a
        message could not be delivered within message.timeout.ms.
        """
        err = error or kafka_error(
            KafkaError._MSG_TIMED_OUT,
            f"Local: Message timed out (test failure injected on {topic})",
            retriable=True,
        )
        with self._cond:
            self._cluster.faults.fail(topic, [err] * n)

    def stall(self, topic: str, seconds: float | None = None) -> None:
        """Hold deliveries to ``topic`` for ``seconds`` (until :meth:`unstall` when None).

        Produced messages wait in the producer (counted by ``len(producer)``, not visible to
        consumers) and are written in order when the stall ends; one that waits longer than
        the producer's message.timeout.ms fails with ``_MSG_TIMED_OUT`` instead.
        """
        until = float("inf") if seconds is None else time.monotonic() + seconds
        with self._cond:
            self._cluster.faults.stall(topic, until)

    def unstall(self, topic: str) -> None:
        with self._cond:
            self._cluster.faults.unstall(topic)
            self._cluster.tick_locked()
            self._cond.notify_all()

    # -- share groups ---------------------------------------------------------------------
    def configure_share_group(self, group: str, settings: dict[str, str]) -> None:
        """Set share-group configuration (share.auto.offset.reset, share.delivery.count.limit,
        share.record.lock.duration.ms), as the AdminClient's GROUP resource does on Kafka."""
        with self._cond:
            self._cluster.shares.configure(group, settings)

    def share_states(self, group: str, topic: str) -> dict[tuple[int, int], tuple[str, int]]:
        """(partition, offset) -> (state, delivery count) of each record the group acquired:
        state is available, acquired, acknowledged or archived."""
        with self._cond:
            return self._cluster.shares.states(group, topic)

    def clients(self, name: str = "") -> MemoryClients:
        """A client factory for one worker; :meth:`MemoryClients.kill` abandons its clients."""
        return MemoryClients(self._cluster, name)
