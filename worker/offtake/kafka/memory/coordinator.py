"""The group coordinator of the memory broker: membership, generations, ownership, commits.

Owns every consumer group: who is a member, the target assignment of the current generation,
who owns each partition now, the committed offsets and the log of :class:`GroupEvent`. It
has no lock of its own: every method runs with the broker lock held (the
:class:`~.cluster.Cluster` condition, passed in so that changes wake waiting clients), and it
never calls application code. Members learn of a new generation lazily, when their consumer
asks for its :meth:`GroupCoordinator.next_step` inside ``consume()``: that is where
librdkafka serves rebalance callbacks too.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from confluent_kafka import KafkaError

from .assignors import RebalanceProtocol, assign_range, assign_roundrobin, assign_sticky
from .errors import kafka_error
from .messages import TP, MemoryMessage, error_message, tp_name
from .settings import ConsumerSettings
from .storage import TopicStore

log = logging.getLogger(__name__)

EventKind = Literal["join", "leave", "assign", "revoke", "lost", "depart"]
RebalanceStep = tuple[Literal["assign", "revoke", "lost"], list[TP]]


@dataclass(frozen=True)
class GroupEvent:
    """Something that happened in a consumer group, for assertions in tests.

    ``kind`` is one of join, leave, assign (the member took ownership, just before its
    on_assign ran), revoke (on_revoke returned and the member released the partitions),
    lost (ownership taken away without a revoke: killed, max.poll.interval.ms exceeded, a
    static member's session timed out or it was fenced), depart (a static member closed or
    was killed: it keeps its partitions until session.timeout.ms or until the same
    group.instance.id rejoins).
    """

    seq: int
    at: float
    group: str
    member: str
    kind: EventKind
    partitions: tuple[TP, ...]


@dataclass(eq=False)
class Member:
    """One consumer's membership of its group (a rejoin makes a new one)."""

    member_id: str
    group: str
    topics: list[str]
    max_poll_interval: float
    # Where the coordinator leaves events for the member's consumer (max.poll exceeded,
    # fenced); the consumer returns them from its next consume().
    mailbox: deque[MemoryMessage]
    owned: set[TP] = field(default_factory=set)
    # The last generation whose assignment this member has been told about (on_assign ran).
    seen_generation: int = 0
    last_poll: float = field(default_factory=time.monotonic)
    waiting: bool = False  # blocked inside consume(): polling, so never "stuck"
    lost: bool = False  # removed from the group without a revoke
    # Static membership (KIP-345): group.instance.id, and when the instance went away.
    instance_id: str | None = None
    session_timeout: float = 45.0
    departed: float | None = None
    fenced: bool = False  # replaced by a newer consumer with the same group.instance.id


@dataclass(eq=False)
class Group:
    name: str
    protocol: RebalanceProtocol | None = None
    strategy: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    generation: int = 0
    target: dict[str, set[TP]] = field(default_factory=dict)
    owner: dict[TP, str] = field(default_factory=dict)
    committed: dict[TP, int] = field(default_factory=dict)


class GroupCoordinator:
    """All consumer groups of one memory broker; call every method with the broker lock held."""

    def __init__(self, cond: threading.Condition, store: TopicStore) -> None:
        self._cond = cond
        self._store = store
        self.groups: dict[str, Group] = {}
        self.events: list[GroupEvent] = []
        self.rejected: list[str] = []  # why each rejected commit was rejected
        self._member_seq = itertools.count(1)
        self._event_seq = itertools.count(1)

    def group(self, name: str) -> Group:
        """The group of that name, created empty on first use."""
        g = self.groups.get(name)
        if g is None:
            g = self.groups[name] = Group(name)
        return g

    def record(self, group: str, member: str, kind: EventKind, parts: Iterable[TP]) -> None:
        self.events.append(
            GroupEvent(
                next(self._event_seq), time.monotonic(), group, member, kind, tuple(sorted(parts))
            )
        )

    def topology_changed(self, topic: str) -> None:
        """A topic appeared or grew: rebalance the groups with a member subscribed to it."""
        for g in self.groups.values():
            if any(topic in self._store.resolve(m.topics) for m in g.members.values()):
                self.rebalance(g)
        self._cond.notify_all()

    # -- membership -----------------------------------------------------------------------
    def join(
        self, settings: ConsumerSettings, topics: list[str], mailbox: deque[MemoryMessage]
    ) -> Member | None:
        """Add a member; None when the group refused it (the error is in the mailbox).

        As with Kafka, a consumer whose assignors the group's members do not share is
        refused with INCONSISTENT_GROUP_PROTOCOL, which librdkafka reports from consume().
        """
        g = self.group(settings.group_id)
        if not g.members:
            g.protocol = settings.protocol
            g.strategy = settings.strategies[0]
        elif settings.protocol != g.protocol or g.strategy not in settings.strategies:
            mailbox.append(
                error_message(
                    kafka_error(
                        KafkaError.INCONSISTENT_GROUP_PROTOCOL,
                        f"JoinGroup failed: Broker: Inconsistent group protocol: group "
                        f"{g.name!r} uses {g.strategy} ({g.protocol}); this consumer's "
                        f"partition.assignment.strategy is {','.join(settings.strategies)}",
                    )
                )
            )
            return None
        member = Member(
            member_id=f"{settings.client_id}-{next(self._member_seq):06d}",
            group=g.name,
            topics=list(topics),
            max_poll_interval=settings.max_poll_interval,
            mailbox=mailbox,
            instance_id=settings.instance_id,
            session_timeout=settings.session_timeout,
        )
        if member.instance_id is not None:
            old = next((m for m in g.members.values() if m.instance_id == member.instance_id), None)
            if old is not None:
                self._replace_static(g, old, member)
                return member
        g.members[member.member_id] = member
        self.record(g.name, member.member_id, "join", ())
        self.rebalance(g)
        return member

    def resubscribe(self, member: Member, topics: list[str]) -> None:
        member.topics = list(topics)
        self.rebalance(self.groups[member.group])

    def _replace_static(self, g: Group, old: Member, new: Member) -> None:
        """KIP-345: a static member that comes back takes over its old assignment as it is,
        without a rebalance; a still-running holder of the same group.instance.id is fenced.
        """
        if old.departed is None:
            old.lost = old.fenced = True
            # librdkafka raises this as a fatal error: an event with code _FATAL and the cause
            # in its text. The event's own fatal() is False, as with confluent-kafka: only
            # the code says that the consumer is unusable now.
            old.mailbox.append(
                error_message(
                    kafka_error(
                        KafkaError._FATAL,
                        "Fatal error: Broker: Static consumer fenced by other consumer with "
                        f"same group.instance.id ({old.instance_id!r})",
                    )
                )
            )
        target = g.target.pop(old.member_id, set())
        self.release(g, old, old.owned)
        del g.members[old.member_id]
        g.members[new.member_id] = new
        g.target[new.member_id] = target
        new.seen_generation = g.generation - 1  # so that on_assign hands it the assignment
        self.record(g.name, new.member_id, "join", ())
        if sorted(old.topics) != sorted(new.topics):
            self.rebalance(g)

    def depart(self, member: Member) -> None:
        """A static member went away without leaving: its partitions wait for it."""
        g = self.groups[member.group]
        if member.member_id in g.members and member.departed is None:
            member.departed = time.monotonic()
            self.record(g.name, member.member_id, "depart", member.owned)

    def leave(self, member: Member) -> None:
        g = self.groups[member.group]
        if g.members.pop(member.member_id, None) is None:
            return
        released = self.release(g, member, member.owned)
        self.record(g.name, member.member_id, "leave", released)
        self.rebalance(g)

    def expel(self, member: Member, why: str) -> None:
        """Take a member out without a revoke: its partitions are lost, free for others."""
        g = self.groups[member.group]
        if g.members.pop(member.member_id, None) is None:
            return
        member.lost = True
        lost = self.release(g, member, member.owned)
        self.record(g.name, member.member_id, "lost", lost)
        log.info(
            "memory broker: %s lost %s (%s)",
            member.member_id,
            ", ".join(map(tp_name, lost)) or "nothing",
            why,
        )
        self.rebalance(g)

    def expire(self, now: float) -> None:
        """Expel members whose static session or max.poll.interval.ms ran out."""
        for g in self.groups.values():
            for m in list(g.members.values()):
                if m.departed is not None:
                    if now - m.departed > m.session_timeout:
                        self.expel(m, "static member's session.timeout.ms expired")
                    continue
                if not m.waiting and now - m.last_poll > m.max_poll_interval:
                    log.warning(
                        "memory broker: member %s of group %s did not poll for %.1fs "
                        "(max.poll.interval.ms); removing it from the group",
                        m.member_id,
                        g.name,
                        now - m.last_poll,
                    )
                    self.expel(m, "max.poll.interval.ms exceeded")
                    m.mailbox.append(
                        error_message(
                            kafka_error(
                                KafkaError._MAX_POLL_EXCEEDED,
                                "Application maximum poll interval "
                                f"({int(m.max_poll_interval * 1000)}ms) exceeded by "
                                f"{int((now - m.last_poll - m.max_poll_interval) * 1000)}ms",
                            )
                        )
                    )

    # -- assignment -----------------------------------------------------------------------
    def release(self, g: Group, member: Member, parts: Iterable[TP]) -> list[TP]:
        released = sorted(parts)
        for tp in released:
            member.owned.discard(tp)
            if g.owner.get(tp) == member.member_id:
                del g.owner[tp]
        self._cond.notify_all()
        return released

    def revoked(self, member: Member, parts: Iterable[TP], *, rejoin: bool) -> None:
        """The member's on_revoke returned: release the partitions for their new owners."""
        g = self.groups[member.group]
        released = self.release(g, member, parts)
        self.record(g.name, member.member_id, "revoke", released)
        if g.protocol == "cooperative" and rejoin:
            # KIP-429: the revoking member rejoins and a second rebalance hands the freed
            # partitions over; every member sees it (on_assign, maybe with an empty list),
            # as with librdkafka.
            self.rebalance(g)

    def rebalance(self, g: Group) -> None:
        """New membership or topics: compute the target assignment of a new generation."""
        members = [(m.member_id, self._store.resolve(m.topics)) for m in g.members.values()]
        wanted = set().union(*(topics for _, topics in members)) if members else set()
        partitions = {t: len(self._store.partitions(t)) for t in wanted}
        if g.protocol == "cooperative":
            g.target = assign_sticky(
                members, partitions, {m.member_id: m.owned for m in g.members.values()}
            )
        elif g.strategy == "roundrobin":
            g.target = assign_roundrobin(members, partitions)
        else:
            g.target = assign_range(members, partitions)
        g.generation += 1
        self._cond.notify_all()

    def next_step(self, member: Member) -> RebalanceStep | None:
        """The rebalance step a member still in the group must take now.

        Partitions it is given are claimed at once, so that nobody else can be given them.
        """
        g = self.groups[member.group]
        target = g.target.get(member.member_id, set())
        if g.protocol == "cooperative":
            revoke = member.owned - target
            if revoke:
                return ("revoke", sorted(revoke))
            free = {tp for tp in target - member.owned if tp not in g.owner}
            if free or member.seen_generation < g.generation:
                member.seen_generation = g.generation
                return ("assign", self._claim(g, member, free))
            return None
        if member.seen_generation >= g.generation:
            return None
        if member.owned:
            return ("revoke", sorted(member.owned))
        if any(tp in g.owner for tp in target):
            return None  # eager: wait until every previous owner has revoked
        member.seen_generation = g.generation
        return ("assign", self._claim(g, member, target))

    def _claim(self, g: Group, member: Member, parts: Iterable[TP]) -> list[TP]:
        claimed = sorted(parts)
        for tp in claimed:
            g.owner[tp] = member.member_id
            member.owned.add(tp)
        self.record(g.name, member.member_id, "assign", claimed)
        return claimed

    # -- offsets --------------------------------------------------------------------------
    def commit(
        self,
        group: str,
        member: Member | None,
        subscribed: bool,
        offsets: list[tuple[str, int, int]],
    ) -> KafkaError | None:
        """Store offsets for the group, all or nothing; the error if rejected.

        ``subscribed`` says whether the committing consumer uses the group's membership
        (subscribe) or assigns partitions itself (assign, no member).
        """
        g = self.group(group)
        problem: tuple[int, str] | None = None
        if not subscribed:
            # Kafka accepts commits from outside the group only while the group is empty.
            if g.members:
                problem = (
                    KafkaError.UNKNOWN_MEMBER_ID,
                    f"consumer is not a member of group {g.name!r}, which has active members "
                    f"({', '.join(g.members)})",
                )
        elif member is None or member.lost:
            who = member.member_id if member else "(not joined)"
            problem = (
                KafkaError.UNKNOWN_MEMBER_ID,
                f"member {who} is no longer in group {g.name!r} (lost its partitions); "
                "they may already be owned by another member",
            )
        else:
            stray = [(t, p, o) for t, p, o in offsets if (t, p) not in member.owned]
            if stray:
                t, p, o = stray[0]
                holder = g.owner.get((t, p))
                problem = (
                    KafkaError.ILLEGAL_GENERATION,
                    f"{t}[{p}]@{o}: partition not assigned to member {member.member_id} "
                    f"of group {g.name!r} (generation {g.generation}; "
                    f"{'owned by ' + holder if holder else 'currently unowned'})",
                )
        if problem is not None:
            code, why = problem
            text = f"commit rejected by the memory broker: {why}"
            self.rejected.append(text)
            log.warning("%s", text)
            return kafka_error(code, text)
        for t, p, o in offsets:
            g.committed[(t, p)] = o
        self._cond.notify_all()
        return None

    def committed(self, group: str) -> dict[TP, int]:
        """A group's committed offsets (empty for a group that does not exist)."""
        g = self.groups.get(group)
        return g.committed if g is not None else {}
