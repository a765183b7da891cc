"""Share groups (KIP-932) of the memory broker: records handed out one by one, under locks.

Owns :class:`ShareGroups`: per group its settings (``share.auto.offset.reset``,
``share.delivery.count.limit``, ``share.record.lock.duration.ms``) and per partition the share
start offset and the state of each record from there on: available, acquired (by a member,
until a deadline), acknowledged or archived, with its delivery count. As on Kafka: a record's
delivery count grows on each acquisition; a lock that expires makes it available again; a
record delivered ``share.delivery.count.limit`` times and not accepted is archived; RELEASE
makes it available at once, REJECT archives it; an acknowledgement by a member that no longer
holds the record is refused (INVALID_RECORD_STATE). Every member fetches from every partition
of the topics it subscribed to (Kafka assigns each partition to some of the members, again
every share.assignment.interval.ms: which member gets a record is all that differs). Runs with
the broker lock held, like every part of the :class:`~.cluster.Cluster`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from .messages import TP, Entry
from .storage import TopicStore

AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED = "available", "acquired", "acknowledged", "archived"
ACCEPT, RELEASE, REJECT = 1, 2, 3  # confluent_kafka.AcknowledgeType's values

#: Kafka's defaults for a new share group.
DEFAULTS = {
    "share.auto.offset.reset": "latest",
    "share.delivery.count.limit": "5",
    "share.record.lock.duration.ms": "30000",
}


@dataclass
class RecordState:
    state: str = AVAILABLE
    delivery_count: int = 0
    owner: int | None = None
    deadline: float = 0.0


@dataclass
class SharePartition:
    start: int  # the share start offset: every record before it is done
    records: dict[int, RecordState] = field(default_factory=dict)


@dataclass
class ShareGroup:
    config: dict[str, str] = field(default_factory=lambda: dict(DEFAULTS))
    partitions: dict[TP, SharePartition] = field(default_factory=dict)
    members: dict[int, frozenset[str]] = field(default_factory=dict)  # member -> topics


@dataclass(frozen=True)
class Acquired:
    tp: TP
    offset: int
    entry: Entry
    delivery_count: int


class ShareGroups:
    """Every share group of one broker; see the module docstring."""

    def __init__(self, store: TopicStore) -> None:
        self._store = store
        self._groups: dict[str, ShareGroup] = {}
        self._ids = itertools.count(1)
        self._turn = 0  # rotates the partition a fetch starts at, so members share them all

    def group(self, name: str) -> ShareGroup:
        return self._groups.setdefault(name, ShareGroup())

    def configure(self, name: str, settings: dict[str, str]) -> None:
        unknown = sorted(set(settings) - set(DEFAULTS))
        if unknown:
            raise ValueError(f"unknown share group configuration {unknown[0]!r}")
        self.group(name).config.update(settings)

    def join(self, name: str, topics: frozenset[str]) -> int:
        member = next(self._ids)
        self.group(name).members[member] = topics
        return member

    def leave(self, name: str, member: int) -> None:
        """A member that closes: what it still holds is available again at once."""
        g = self.group(name)
        g.members.pop(member, None)
        for part in g.partitions.values():
            for rec in part.records.values():
                if rec.state == ACQUIRED and rec.owner == member:
                    self._make_available(g, rec)

    def acquire(self, name: str, member: int, max_records: int, now: float) -> list[Acquired]:
        g = self.group(name)
        self.expire(now)
        topics = self._store.resolve(g.members.get(member, frozenset()))
        tps = [(t, p) for t in sorted(topics) for p in range(len(self._store.partitions(t)))]
        if not tps:
            return []
        self._turn += 1
        lock = int(g.config["share.record.lock.duration.ms"]) / 1000
        out: list[Acquired] = []
        for i in range(len(tps)):
            tp = tps[(self._turn + i) % len(tps)]
            part = self._partition(g, tp)
            log = self._store.partitions(tp[0])[tp[1]]
            for offset in range(part.start, len(log)):
                if len(out) >= max_records:
                    return out
                rec = part.records.setdefault(offset, RecordState())
                if rec.state != AVAILABLE:
                    continue
                rec.state, rec.owner, rec.deadline = ACQUIRED, member, now + lock
                rec.delivery_count += 1
                out.append(Acquired(tp, offset, log[offset], rec.delivery_count))
        return out

    def acknowledge(self, name: str, member: int, tp: TP, offset: int, kind: int) -> bool:
        """False (INVALID_RECORD_STATE) unless ``member`` holds the record now."""
        g = self.group(name)
        part = g.partitions.get(tp)
        rec = part.records.get(offset) if part is not None else None
        if rec is None or rec.state != ACQUIRED or rec.owner != member:
            return False
        if kind == ACCEPT:
            rec.state, rec.owner = ACKNOWLEDGED, None
        elif kind == REJECT:
            rec.state, rec.owner = ARCHIVED, None
        else:
            self._make_available(g, rec)
        assert part is not None
        self._advance(part)
        return True

    def expire(self, now: float) -> None:
        """Locks past their deadline: the records are available again (or archived)."""
        for g in self._groups.values():
            for part in g.partitions.values():
                for rec in part.records.values():
                    if rec.state == ACQUIRED and rec.deadline <= now:
                        self._make_available(g, rec)
                self._advance(part)

    def states(self, name: str, topic: str) -> dict[tuple[int, int], tuple[str, int]]:
        """(partition, offset) -> (state, delivery count) of every record acquired so far."""
        g = self.group(name)
        return {
            (tp[1], offset): (rec.state, rec.delivery_count)
            for tp, part in g.partitions.items()
            if tp[0] == topic
            for offset, rec in part.records.items()
        }

    def _partition(self, g: ShareGroup, tp: TP) -> SharePartition:
        part = g.partitions.get(tp)
        if part is None:
            latest = g.config["share.auto.offset.reset"] == "latest"
            part = SharePartition(self._store.high_watermark(*tp) if latest else 0)
            g.partitions[tp] = part
        return part

    @staticmethod
    def _make_available(g: ShareGroup, rec: RecordState) -> None:
        limit = int(g.config["share.delivery.count.limit"])
        rec.state = ARCHIVED if rec.delivery_count >= limit else AVAILABLE
        rec.owner = None

    @staticmethod
    def _advance(part: SharePartition) -> None:
        while (rec := part.records.get(part.start)) is not None and rec.state in (
            ACKNOWLEDGED,
            ARCHIVED,
        ):
            part.start += 1  # kept for states(): a test broker's records are few
