"""An in-memory Kafka broker whose clients behave like confluent-kafka's, for tests.

The clients implement the subset of confluent-kafka the engine uses (see
:mod:`offtake.kafka.protocols`) with librdkafka's semantics where the engine can observe them:

- Rebalance callbacks (``on_assign``, ``on_revoke``, ``on_lost``) and commit callbacks
  (``on_commit`` in the consumer config) run inside ``consume()``/``poll()``/``close()`` on the
  calling thread. A callback that does not call ``(incremental_)assign``/``unassign`` itself gets
  the same automatic call the confluent-kafka wrapper makes after it returns.
- Cooperative-sticky groups revoke only the partitions that move; a moved partition is handed
  to its new owner only after the old owner's ``on_revoke`` returned, so at no time do two
  members own a partition. ``on_assign`` runs once per rebalance, even with an empty list, and
  ``on_revoke`` never runs with an empty list (KIP-429). Eager groups (``range``,
  ``roundrobin``: librdkafka's default) revoke everything, and a member gets its new
  assignment once every previous owner of it has revoked.
- A newly assigned partition starts at the group's committed offset, else at
  ``auto.offset.reset`` (default ``latest``, as in librdkafka); it starts unpaused.
- Asynchronous commits report through ``on_commit`` from a later ``consume()``; synchronous
  commits return the offsets or raise and, as in confluent-kafka, do not call ``on_commit``.
- A commit for a partition this member does not own is rejected (a real broker may accept it
  silently and overwrite the new owner's progress; here it is a loud test failure): a
  synchronous commit raises ``KafkaException``, an asynchronous one reports the error to
  ``on_commit``; both are logged and listed in :attr:`MemoryBroker.rejected_commits`.
- ``enable.auto.commit`` and ``enable.auto.offset.store`` default to true as in librdkafka.
- A member that does not call ``consume()`` for ``max.poll.interval.ms`` is removed from the
  group; its next ``consume()`` returns a ``_MAX_POLL_EXCEEDED`` error message, calls
  ``on_lost`` (``on_revoke`` when unset) and rejoins.
- Static members (``group.instance.id``, KIP-345) do not leave the group on ``close()``:
  their partitions wait for the same instance to come back (no rebalance) or for
  ``session.timeout.ms``; a second consumer with the same id fences the first.
- Producer delivery reports are served by ``poll()``/``flush()`` on the calling thread;
  ``len(producer)`` counts messages not yet reported; a full queue raises ``BufferError``.

Test hooks: :meth:`MemoryBroker.fail_produce` and :meth:`MemoryBroker.stall` make deliveries
fail or hang; :meth:`MemoryClients.kill` abandons a worker's clients as SIGKILL would.

One broker-wide lock guards all state, with a condition variable that wakes waiting consumers
and producers on every change. No callback ever runs with the lock held.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, NoReturn

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    TIMESTAMP_CREATE_TIME,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin._metadata import (
    BrokerMetadata,
    ClusterMetadata,
    PartitionMetadata,
    TopicMetadata,
)

if TYPE_CHECKING:
    from offtake.kafka.protocols import ClientFactory

__all__ = [
    "ClientKilled",
    "GroupEvent",
    "MemoryBroker",
    "MemoryClients",
    "MemoryConsumer",
    "MemoryMessage",
    "MemoryProducer",
]

log = logging.getLogger(__name__)

_TP = tuple[str, int]
Header = tuple[str, bytes | None]
RebalanceCallback = Callable[[Any, list[Any]], None]
DeliveryCallback = Callable[[Any, Any], None]

# Waits are sliced so that time-based state (stalls ending, max.poll.interval.ms) advances
# even when no other thread notifies the condition.
_WAIT_SLICE = 0.05


class ClientKilled(BaseException):
    """Raised by every call on a client whose worker the test harness killed.

    It derives from BaseException, like SystemExit, so that the engine's ``except Exception``
    handlers do not turn a simulated SIGKILL into error handling that talks to the broker.
    """


def _error(code: int, reason: str, *, retriable: bool = False, fatal: bool = False) -> KafkaError:
    return KafkaError(code, reason, fatal=fatal, retriable=retriable)


def _raise(code: int, reason: str) -> NoReturn:
    raise KafkaException(_error(code, reason))


def _to_bytes(value: Any, what: str) -> bytes | None:
    """bytes as they are, str as UTF-8, like confluent-kafka; anything else is a TypeError."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"{what} must be bytes, str or None, got {type(value).__name__}")


def _encode_any(value: Any) -> bytes | None:
    """For the admin helper only: also accepts dicts, lists and numbers, as compact JSON."""
    if value is None or isinstance(value, bytes | bytearray | memoryview | str):
        return _to_bytes(value, "value")
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _headers(headers: Any) -> tuple[Header, ...] | None:
    if not headers:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: list[Header] = []
    for item in items:
        name, value = item
        if not isinstance(name, str):
            raise TypeError(f"header names must be str, got {type(name).__name__}")
        out.append((name, _to_bytes(value, f"header {name!r}")))
    return tuple(out)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _conf_bool(config: Mapping[str, Any], key: str, default: bool) -> bool:
    value = config.get(key, default)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    _raise(
        KafkaError._INVALID_ARG,
        f"configuration property {key!r}: expected true or false, got {value!r}",
    )


def _conf_ms(config: Mapping[str, Any], key: str, default: int) -> float:
    """A librdkafka ``*.ms`` property, in seconds."""
    value = config.get(key, default)
    try:
        return int(value) / 1000.0
    except (TypeError, ValueError):
        _raise(
            KafkaError._INVALID_ARG,
            f"configuration property {key!r}: expected milliseconds, got {value!r}",
        )


def _deadline(timeout: float | None) -> float | None:
    """confluent-kafka's convention: None or a negative timeout waits forever."""
    if timeout is None or timeout < 0:
        return None
    return time.monotonic() + timeout


def _remaining(deadline: float | None) -> float:
    if deadline is None:
        return _WAIT_SLICE
    return deadline - time.monotonic()


def _tp_name(tp: _TP) -> str:
    return f"{tp[0]}[{tp[1]}]"


def _tps(parts: Iterable[_TP], offsets: Mapping[_TP, int] | None = None) -> list[Any]:
    return [
        TopicPartition(t, p, offsets.get((t, p), OFFSET_INVALID) if offsets else OFFSET_INVALID)
        for t, p in sorted(parts)
    ]


# -- messages ---------------------------------------------------------------------------------


class _Entry(NamedTuple):
    """One record as the broker stores it."""

    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] | None
    timestamp: int


class MemoryMessage:
    """A record or an event, with the accessors of ``confluent_kafka.Message``."""

    __slots__ = (
        "_error",
        "_headers",
        "_key",
        "_offset",
        "_partition",
        "_timestamp",
        "_topic",
        "_value",
    )

    def __init__(
        self,
        topic: str | None,
        partition: int | None,
        offset: int | None,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: Sequence[Header] | None = None,
        timestamp: int | None = None,
        error: KafkaError | None = None,
    ) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key = key
        self._value = value
        self._headers = list(headers) if headers else None
        self._timestamp = timestamp
        self._error = error

    def error(self) -> KafkaError | None:
        return self._error

    def topic(self) -> str | None:
        return self._topic

    def partition(self) -> int | None:
        return self._partition

    def offset(self) -> int | None:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[Header] | None:
        # A copy, like confluent-kafka, so callers cannot edit the stored record.
        return list(self._headers) if self._headers is not None else None

    def timestamp(self) -> tuple[int, int]:
        if self._timestamp is None:
            return (0, 0)  # TIMESTAMP_NOT_AVAILABLE
        return (TIMESTAMP_CREATE_TIME, self._timestamp)

    def latency(self) -> float | None:
        return None

    def leader_epoch(self) -> int | None:
        return None

    def set_key(self, key: bytes | None) -> None:
        self._key = key

    def set_value(self, value: bytes | None) -> None:
        self._value = value

    def set_headers(self, headers: Sequence[Header] | None) -> None:
        self._headers = list(headers) if headers else None

    def __len__(self) -> int:
        return len(self._value or b"")

    def __repr__(self) -> str:
        where = f"{self._topic}[{self._partition}]@{self._offset}"
        if self._error is not None:
            return f"MemoryMessage({where}, error={self._error})"
        return f"MemoryMessage({where}, key={self._key!r}, value={self._value!r})"


def _message(topic: str, partition: int, offset: int, entry: _Entry) -> MemoryMessage:
    return MemoryMessage(
        topic, partition, offset, entry.key, entry.value, entry.headers, entry.timestamp
    )


# -- group state ------------------------------------------------------------------------------


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
    kind: Literal["join", "leave", "assign", "revoke", "lost", "depart"]
    partitions: tuple[_TP, ...]


@dataclass(eq=False)
class _Member:
    member_id: str
    consumer: MemoryConsumer
    topics: list[str]
    max_poll_interval: float
    owned: set[_TP] = field(default_factory=set)
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
class _Group:
    name: str
    protocol: Literal["cooperative", "eager"] | None = None
    strategy: str = ""
    members: dict[str, _Member] = field(default_factory=dict)
    generation: int = 0
    target: dict[str, set[_TP]] = field(default_factory=dict)
    owner: dict[_TP, str] = field(default_factory=dict)
    committed: dict[_TP, int] = field(default_factory=dict)


def _assign_range(
    members: list[tuple[str, set[str]]], partitions: Mapping[str, int]
) -> dict[str, set[_TP]]:
    """Kafka's range assignor: per topic, contiguous ranges to members sorted by id."""
    target: dict[str, set[_TP]] = {m: set() for m, _ in members}
    for topic in sorted(partitions):
        subs = sorted(m for m, topics in members if topic in topics)
        if not subs:
            continue
        per, extra = divmod(partitions[topic], len(subs))
        start = 0
        for i, m in enumerate(subs):
            n = per + (1 if i < extra else 0)
            target[m].update((topic, p) for p in range(start, start + n))
            start += n
    return target


def _assign_roundrobin(
    members: list[tuple[str, set[str]]], partitions: Mapping[str, int]
) -> dict[str, set[_TP]]:
    """Kafka's roundrobin assignor: all partitions in order, dealt to members sorted by id."""
    target: dict[str, set[_TP]] = {m: set() for m, _ in members}
    order = sorted(members)
    if not order:
        return target
    i = 0
    for topic in sorted(partitions):
        subs = [m for m, topics in order if topic in topics]
        if not subs:
            continue
        for p in range(partitions[topic]):
            while order[i % len(order)][0] not in subs:
                i += 1
            target[order[i % len(order)][0]].add((topic, p))
            i += 1
    return target


def _assign_sticky(
    members: list[tuple[str, set[str]]],
    partitions: Mapping[str, int],
    owned: Mapping[str, set[_TP]],
) -> dict[str, set[_TP]]:
    """Balanced and sticky: each member keeps what it owns up to its fair share.

    With equal subscriptions the result is balanced to within one partition and moves only
    partitions that must move, which is what cooperative-sticky promises.
    """
    target: dict[str, set[_TP]] = {m: set() for m, _ in members}
    if not members:
        return target
    order = {m: i for i, (m, _) in enumerate(members)}
    subs = dict(members)
    all_parts = sorted((t, p) for t, n in partitions.items() for p in range(n))
    eligible = {tp: [m for m, _ in members if tp[0] in subs[m]] for tp in all_parts}
    base, extra = divmod(len(all_parts), len(members))
    taken: set[_TP] = set()
    for m, _ in members:
        keep = sorted(
            tp
            for tp in owned.get(m, ())
            if tp in eligible and m in eligible[tp] and tp not in taken
        )
        limit = base
        if len(keep) > base and extra > 0:
            limit, extra = base + 1, extra - 1
        for tp in keep[:limit]:
            target[m].add(tp)
            taken.add(tp)
    for tp in all_parts:
        if tp in taken or not eligible[tp]:
            continue
        m = min(eligible[tp], key=lambda c: (len(target[c]), order[c]))
        target[m].add(tp)
    return target


def _parse_strategy(value: Any) -> tuple[Literal["cooperative", "eager"], list[str]]:
    names = [s.strip() for s in str(value).split(",") if s.strip()]
    known = {"range", "roundrobin", "cooperative-sticky"}
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        _raise(
            KafkaError._INVALID_ARG,
            f"partition.assignment.strategy: unsupported {', '.join(unknown) or 'empty value'}; "
            "expected range, roundrobin or cooperative-sticky",
        )
    if "cooperative-sticky" in names:
        if len(names) > 1:
            _raise(
                KafkaError._INVALID_ARG,
                "partition.assignment.strategy: cooperative-sticky cannot be mixed with "
                "eager assignors",
            )
        return "cooperative", names
    return "eager", names


# -- producer-side deliveries ---------------------------------------------------------------


@dataclass(eq=False)
class _Delivery:
    producer: MemoryProducer
    topic: str
    partition: int
    entry: _Entry
    callback: DeliveryCallback | None
    expires: float  # message.timeout.ms after produce()
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


# -- the broker -------------------------------------------------------------------------------


class MemoryBroker:
    """Topics, consumer groups and committed offsets in memory; see the module docstring.

    ``auto_create_topics`` mirrors the broker setting of the same name: producing to, or
    assigning, an unknown topic creates it with ``default_partitions`` partitions.
    """

    def __init__(self, *, auto_create_topics: bool = True, default_partitions: int = 1) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._auto_create = auto_create_topics
        self._default_partitions = default_partitions
        self._topics: dict[str, list[list[_Entry]]] = {}
        self._groups: dict[str, _Group] = {}
        self._stalls: dict[
            str, float
        ] = {}  # topic -> monotonic time the stall ends (inf: until unstall)
        self._failures: dict[str, deque[KafkaError]] = {}
        self._in_transit: list[_Delivery] = []  # stalled deliveries, in produce order
        self._round_robin: dict[str, int] = {}
        self._member_seq = itertools.count(1)
        self._event_seq = itertools.count(1)
        self._events: list[GroupEvent] = []
        self._rejected: list[str] = []

    # -- admin API (tests) ------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create a topic; a no-op if it exists with that many partitions."""
        if partitions < 1:
            raise ValueError(f"topic {name!r}: partitions must be at least 1, got {partitions}")
        with self._cond:
            existing = self._topics.get(name)
            if existing is not None:
                if len(existing) != partitions:
                    raise ValueError(
                        f"topic {name!r} exists with {len(existing)} partitions, not {partitions}; "
                        "use create_partitions() to add partitions"
                    )
                return
            self._create_topic_locked(name, partitions)

    def create_partitions(self, name: str, total: int) -> None:
        """Grow a topic to ``total`` partitions, rebalancing the groups that read it."""
        with self._cond:
            parts = self._topic_locked(name)
            if total < len(parts):
                raise ValueError(
                    f"topic {name!r} has {len(parts)} partitions; Kafka cannot remove partitions"
                )
            parts.extend([] for _ in range(total - len(parts)))
            self._topology_changed_locked(name)

    def topics(self) -> dict[str, int]:
        """Topic names and their partition counts."""
        with self._cond:
            return {name: len(parts) for name, parts in self._topics.items()}

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
        entry = _Entry(
            _encode_any(key) if not isinstance(key, bytes) else key,
            _encode_any(value),
            _headers(headers),
            _now_ms() if timestamp is None else timestamp,
        )
        with self._cond:
            if topic not in self._topics:
                self._create_topic_locked(topic, self._default_partitions)
            p = self._choose_partition_locked(
                topic, entry.key, -1 if partition is None else partition
            )
            offset = self._append_locked(topic, p, entry)
        return _message(topic, p, offset, entry)

    def records(self, topic: str) -> list[MemoryMessage]:
        """Every record of a topic, in partition then offset order."""
        with self._cond:
            self._tick_locked()
            parts = self._topic_locked(topic)
            return [
                _message(topic, p, o, e) for p, log_ in enumerate(parts) for o, e in enumerate(log_)
            ]

    def end_offsets(self, topic: str) -> dict[int, int]:
        """The log-end offset (high watermark) of each partition."""
        with self._cond:
            self._tick_locked()
            return {p: len(log_) for p, log_ in enumerate(self._topic_locked(topic))}

    def committed(self, group: str, topic: str, partition: int) -> int | None:
        """The group's committed offset of a partition, None when it never committed."""
        with self._cond:
            g = self._groups.get(group)
            return g.committed.get((topic, partition)) if g else None

    def set_committed(self, group: str, topic: str, partition: int, offset: int) -> None:
        """Store a committed offset as an admin would (rewind, or seed a test)."""
        with self._cond:
            self._group_locked(group).committed[(topic, partition)] = offset
            self._cond.notify_all()

    def lag(self, group: str, topics: Iterable[str] | None = None) -> dict[_TP, int]:
        """Log-end minus committed offset per partition (the whole log when nothing committed)."""
        with self._cond:
            self._tick_locked()
            g = self._groups.get(group)
            names = list(topics) if topics is not None else list(self._topics)
            out: dict[_TP, int] = {}
            for name in names:
                for p, log_ in enumerate(self._topic_locked(name)):
                    done = g.committed.get((name, p), 0) if g else 0
                    out[(name, p)] = max(0, len(log_) - done)
            return out

    def members(self, group: str) -> list[str]:
        """Member ids of a group, in join order."""
        with self._cond:
            g = self._groups.get(group)
            return list(g.members) if g else []

    def assignment(self, group: str) -> dict[str, list[_TP]]:
        """What each member owns now (what it was told through on_assign and not yet revoked)."""
        with self._cond:
            g = self._groups.get(group)
            if g is None:
                return {}
            return {m: sorted(member.owned) for m, member in g.members.items()}

    def generation(self, group: str) -> int:
        with self._cond:
            g = self._groups.get(group)
            return g.generation if g else 0

    def events(self, group: str | None = None) -> list[GroupEvent]:
        """Group events in the order they happened (see :class:`GroupEvent`)."""
        with self._cond:
            return [e for e in self._events if group is None or e.group == group]

    @property
    def rejected_commits(self) -> list[str]:
        """Why each rejected commit was rejected; a correct engine leaves this empty."""
        with self._cond:
            return list(self._rejected)

    def fail_produce(self, topic: str, n: int = 1, error: KafkaError | None = None) -> None:
        """Make the next ``n`` produce() calls to ``topic`` fail delivery (nothing is written).

        The default error is a retriable ``_MSG_TIMED_OUT``, what librdkafka reports when a
        message could not be delivered within message.timeout.ms.
        """
        err = error or _error(
            KafkaError._MSG_TIMED_OUT,
            f"Local: Message timed out (test failure injected on {topic})",
            retriable=True,
        )
        with self._cond:
            self._failures.setdefault(topic, deque()).extend([err] * n)

    def stall(self, topic: str, seconds: float | None = None) -> None:
        """Hold deliveries to ``topic`` for ``seconds`` (until :meth:`unstall` when None).

        Produced messages wait in the producer (counted by ``len(producer)``, not visible to
        consumers) and are written in order when the stall ends; one that waits longer than
        the producer's message.timeout.ms fails with ``_MSG_TIMED_OUT`` instead.
        """
        with self._cond:
            self._stalls[topic] = float("inf") if seconds is None else time.monotonic() + seconds

    def unstall(self, topic: str) -> None:
        with self._cond:
            self._stalls.pop(topic, None)
            self._tick_locked()
            self._cond.notify_all()

    def clients(self, name: str = "") -> MemoryClients:
        """A client factory for one worker; :meth:`MemoryClients.kill` abandons its clients."""
        return MemoryClients(self, name)

    # -- internals (all *_locked methods run with the lock held) ------------------------
    def _topic_locked(self, name: str) -> list[list[_Entry]]:
        parts = self._topics.get(name)
        if parts is None:
            raise KeyError(
                f"no topic {name!r} in the memory broker (topics: {sorted(self._topics)})"
            )
        return parts

    def _create_topic_locked(self, name: str, partitions: int) -> None:
        self._topics[name] = [[] for _ in range(partitions)]
        self._topology_changed_locked(name)

    def _topology_changed_locked(self, topic: str) -> None:
        """A topic appeared or grew: rebalance the groups with a member subscribed to it."""
        for g in self._groups.values():
            if any(topic in self._resolve_locked(m.topics) for m in g.members.values()):
                self._rebalance_locked(g)
        self._cond.notify_all()

    def _group_locked(self, name: str) -> _Group:
        g = self._groups.get(name)
        if g is None:
            g = self._groups[name] = _Group(name)
        return g

    def _resolve_locked(self, patterns: Iterable[str]) -> set[str]:
        """Subscription entries to existing topics; entries starting with ^ are regexes."""
        out: set[str] = set()
        for pat in patterns:
            if pat.startswith("^"):
                rx = re.compile(pat)
                out.update(t for t in self._topics if rx.search(t))
            elif pat in self._topics:
                out.add(pat)
        return out

    def _record_locked(self, group: str, member: str, kind: Any, parts: Iterable[_TP]) -> None:
        self._events.append(
            GroupEvent(
                next(self._event_seq), time.monotonic(), group, member, kind, tuple(sorted(parts))
            )
        )

    def _choose_partition_locked(self, topic: str, key: bytes | None, partition: int) -> int:
        n = len(self._topics[topic])
        if partition >= 0:
            if partition >= n:
                _raise(
                    KafkaError._UNKNOWN_PARTITION,
                    f"Local: Unknown partition: {topic} has {n} partitions, not {partition + 1}",
                )
            return partition
        if key is None:
            # librdkafka's default partitioner spreads keyless records; round robin is the
            # deterministic version of that.
            i = self._round_robin.get(topic, 0)
            self._round_robin[topic] = i + 1
            return i % n
        return zlib.crc32(key) % n  # consistent_random: CRC32 of the key, as librdkafka

    def _append_locked(self, topic: str, partition: int, entry: _Entry) -> int:
        log_ = self._topics[topic][partition]
        log_.append(entry)
        self._cond.notify_all()
        return len(log_) - 1

    def _tick_locked(self) -> None:
        """Advance time-based state: finish stalled deliveries, expel stuck members."""
        now = time.monotonic()
        for topic, until in list(self._stalls.items()):
            if until <= now:
                del self._stalls[topic]
        if self._in_transit:
            keep: list[_Delivery] = []
            for d in self._in_transit:
                if d.producer._killed:
                    continue
                if d.topic not in self._stalls:
                    d.offset = self._append_locked(d.topic, d.partition, d.entry)
                    d.producer._completed_locked(d)
                elif now >= d.expires:
                    d.error = _error(
                        KafkaError._MSG_TIMED_OUT,
                        "Local: Message timed out (topic stalled by the test)",
                        retriable=True,
                    )
                    d.producer._completed_locked(d)
                else:
                    keep.append(d)
            if len(keep) != len(self._in_transit):
                self._in_transit = keep
                self._cond.notify_all()
        for g in self._groups.values():
            for m in list(g.members.values()):
                if m.departed is not None:
                    if now - m.departed > m.session_timeout:
                        self._expel_locked(m, "static member's session.timeout.ms expired")
                    continue
                if not m.waiting and now - m.last_poll > m.max_poll_interval:
                    log.warning(
                        "memory broker: member %s of group %s did not poll for %.1fs "
                        "(max.poll.interval.ms); removing it from the group",
                        m.member_id,
                        g.name,
                        now - m.last_poll,
                    )
                    self._expel_locked(m, "max.poll.interval.ms exceeded")
                    m.consumer._pending_errors.append(
                        MemoryMessage(
                            None,
                            None,
                            None,
                            error=_error(
                                KafkaError._MAX_POLL_EXCEEDED,
                                "Application maximum poll interval "
                                f"({int(m.max_poll_interval * 1000)}ms) exceeded by "
                                f"{int((now - m.last_poll - m.max_poll_interval) * 1000)}ms",
                            ),
                        )
                    )

    # -- group membership -----------------------------------------------------------------
    def _join_locked(self, consumer: MemoryConsumer, topics: list[str]) -> _Member:
        g = self._group_locked(consumer._group_id)
        if not g.members:
            g.protocol = consumer._protocol
            g.strategy = consumer._strategies[0]
        elif consumer._protocol != g.protocol or g.strategy not in consumer._strategies:
            _raise(
                KafkaError.INCONSISTENT_GROUP_PROTOCOL,
                f"group {g.name!r} uses {g.strategy} ({g.protocol}); this consumer's "
                f"partition.assignment.strategy is {','.join(consumer._strategies)}",
            )
        member = _Member(
            member_id=f"{consumer._client_id}-{next(self._member_seq):06d}",
            consumer=consumer,
            topics=list(topics),
            max_poll_interval=consumer._max_poll_interval,
            instance_id=consumer._instance_id,
            session_timeout=consumer._session_timeout,
        )
        if member.instance_id is not None:
            old = next((m for m in g.members.values() if m.instance_id == member.instance_id), None)
            if old is not None:
                self._replace_static_locked(g, old, member)
                return member
        g.members[member.member_id] = member
        self._record_locked(g.name, member.member_id, "join", ())
        self._rebalance_locked(g)
        return member

    def _replace_static_locked(self, g: _Group, old: _Member, new: _Member) -> None:
        """KIP-345: a static member that comes back takes over its old assignment as it is,
        without a rebalance; a still-running holder of the same group.instance.id is fenced.
        """
        if old.departed is None:
            old.lost = old.fenced = True
            old.consumer._pending_errors.append(
                MemoryMessage(
                    None,
                    None,
                    None,
                    error=_error(
                        KafkaError.FENCED_INSTANCE_ID,
                        f"Broker: Static consumer fenced by another consumer with the same "
                        f"group.instance.id {old.instance_id!r}",
                        fatal=True,
                    ),
                )
            )
        target = g.target.pop(old.member_id, set())
        self._release_locked(g, old, old.owned)
        del g.members[old.member_id]
        g.members[new.member_id] = new
        g.target[new.member_id] = target
        new.seen_generation = g.generation - 1  # so that on_assign hands it the assignment
        self._record_locked(g.name, new.member_id, "join", ())
        if sorted(old.topics) != sorted(new.topics):
            self._rebalance_locked(g)

    def _depart_locked(self, member: _Member) -> None:
        """A static member went away without leaving: its partitions wait for it."""
        g = self._groups[member.consumer._group_id]
        if member.member_id in g.members and member.departed is None:
            member.departed = time.monotonic()
            self._record_locked(g.name, member.member_id, "depart", member.owned)

    def _leave_locked(self, member: _Member) -> None:
        g = self._groups[member.consumer._group_id]
        if g.members.pop(member.member_id, None) is None:
            return
        released = self._release_locked(g, member, member.owned)
        self._record_locked(g.name, member.member_id, "leave", released)
        self._rebalance_locked(g)

    def _expel_locked(self, member: _Member, why: str) -> None:
        """Take a member out without a revoke: its partitions are lost, free for others."""
        g = self._groups[member.consumer._group_id]
        if g.members.pop(member.member_id, None) is None:
            return
        member.lost = True
        lost = self._release_locked(g, member, member.owned)
        self._record_locked(g.name, member.member_id, "lost", lost)
        log.info(
            "memory broker: %s lost %s (%s)",
            member.member_id,
            ", ".join(map(_tp_name, lost)) or "nothing",
            why,
        )
        self._rebalance_locked(g)

    def _release_locked(self, g: _Group, member: _Member, parts: Iterable[_TP]) -> list[_TP]:
        released = sorted(parts)
        for tp in released:
            member.owned.discard(tp)
            if g.owner.get(tp) == member.member_id:
                del g.owner[tp]
        self._cond.notify_all()
        return released

    def _rebalance_locked(self, g: _Group) -> None:
        """New membership or topics: compute the target assignment of a new generation.

        Members learn of it lazily, in their next consume(): that is where librdkafka serves
        rebalance callbacks too.
        """
        members = [(m.member_id, self._resolve_locked(m.topics)) for m in g.members.values()]
        wanted = set().union(*(topics for _, topics in members)) if members else set()
        partitions = {t: len(self._topics[t]) for t in wanted}
        if g.protocol == "cooperative":
            g.target = _assign_sticky(
                members, partitions, {m.member_id: m.owned for m in g.members.values()}
            )
        elif g.strategy == "roundrobin":
            g.target = _assign_roundrobin(members, partitions)
        else:
            g.target = _assign_range(members, partitions)
        g.generation += 1
        self._cond.notify_all()

    def _next_action_locked(self, member: _Member) -> tuple[str, list[_TP]] | None:
        """The rebalance step this member must take now, claiming partitions it is given."""
        g = self._groups[member.consumer._group_id]
        if member.lost:
            return ("lost", sorted(member.consumer._assignment))
        target = g.target.get(member.member_id, set())
        if g.protocol == "cooperative":
            revoke = member.owned - target
            if revoke:
                return ("revoke", sorted(revoke))
            free = {tp for tp in target - member.owned if tp not in g.owner}
            if free or member.seen_generation < g.generation:
                member.seen_generation = g.generation
                return ("assign", self._claim_locked(g, member, free))
            return None
        if member.seen_generation >= g.generation:
            return None
        if member.owned:
            return ("revoke", sorted(member.owned))
        if any(tp in g.owner for tp in target):
            return None  # eager: wait until every previous owner has revoked
        member.seen_generation = g.generation
        return ("assign", self._claim_locked(g, member, target))

    def _claim_locked(self, g: _Group, member: _Member, parts: Iterable[_TP]) -> list[_TP]:
        claimed = sorted(parts)
        for tp in claimed:
            g.owner[tp] = member.member_id
            member.owned.add(tp)
        self._record_locked(g.name, member.member_id, "assign", claimed)
        return claimed

    def _commit_locked(
        self, consumer: MemoryConsumer, offsets: list[tuple[str, int, int]]
    ) -> KafkaError | None:
        """Store offsets for the consumer's group, all or nothing; the error if rejected."""
        g = self._group_locked(consumer._group_id)
        member = consumer._member
        problem: tuple[int, str] | None = None
        if not consumer._subscribed:
            # Kafka accepts commits from outside the group only while the group is empty.
            if g.members:
                problem = (
                    KafkaError.UNKNOWN_MEMBER_ID,
                    f"consumer is not a member of group {g.name!r}, which has active members "
                    f"({', '.join(g.members)})",
                )
        else:
            if member is None or member.lost:
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
            self._rejected.append(text)
            log.warning("%s", text)
            return _error(code, text)
        for t, p, o in offsets:
            g.committed[(t, p)] = o
        self._cond.notify_all()
        return None


# -- consumer ---------------------------------------------------------------------------------


@dataclass
class _Fetch:
    position: int | None  # next offset to fetch; None: auto.offset.reset=error, no commit
    paused: bool = False
    eof_sent: bool = False
    # What position() reports: one past the last record returned to the application. Like
    # librdkafka's, it is unknown (OFFSET_INVALID) after an assign or a seek until a record
    # of the partition has been returned, even though the fetch position is known.
    app_position: int | None = None


class MemoryConsumer:
    """A consumer of the memory broker that behaves like ``confluent_kafka.Consumer``."""

    def __init__(self, broker: MemoryBroker, config: Mapping[str, Any]) -> None:
        self._broker = broker
        self._cond = broker._cond
        conf = dict(config)
        self._on_commit: Callable[[Any, list[Any]], None] | None = conf.pop("on_commit", None)
        group = conf.get("group.id")
        if not group:
            _raise(
                KafkaError._INVALID_ARG, "Failed to create consumer: group.id must be configured"
            )
        self._group_id = str(group)
        reset = str(conf.get("auto.offset.reset", "latest")).lower()
        if reset in ("earliest", "smallest", "beginning"):
            self._reset = "earliest"
        elif reset in ("latest", "largest", "end"):
            self._reset = "latest"
        elif reset == "error":
            self._reset = "error"
        else:
            _raise(
                KafkaError._INVALID_ARG,
                f"auto.offset.reset: expected earliest, latest or error, got {reset!r}",
            )
        self._protocol, self._strategies = _parse_strategy(
            conf.get("partition.assignment.strategy", "range,roundrobin")
        )
        self._auto_commit = _conf_bool(conf, "enable.auto.commit", True)
        self._auto_commit_interval = _conf_ms(conf, "auto.commit.interval.ms", 5000)
        self._auto_store = _conf_bool(conf, "enable.auto.offset.store", True)
        self._eof = _conf_bool(conf, "enable.partition.eof", False)
        self._max_poll_interval = _conf_ms(conf, "max.poll.interval.ms", 300_000)
        self._client_id = str(conf.get("client.id", "rdkafka"))
        self._instance_id: str | None = (
            str(conf["group.instance.id"]) if conf.get("group.instance.id") else None
        )
        self._session_timeout = _conf_ms(conf, "session.timeout.ms", 45_000)
        self._assignment: dict[_TP, _Fetch] = {}
        self._stored: dict[_TP, int] = {}
        self._member: _Member | None = None
        self._subscription: list[str] | None = None
        self._on_assign: RebalanceCallback | None = None
        self._on_revoke: RebalanceCallback | None = None
        self._on_lost: RebalanceCallback | None = None
        self._commit_results: deque[tuple[KafkaError | None, list[Any]]] = deque()
        self._pending_errors: deque[MemoryMessage] = deque()
        self._rebalance_calls = 0  # (incremental_)(un)assign calls made by the app in a callback
        self._rotation = 0
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
            if self._member is not None and not self._member.lost:
                self._member.topics = list(self._subscription)
                self._broker._rebalance_locked(self._broker._groups[self._group_id])
            else:
                self._member = self._broker._join_locked(self, self._subscription)

    def unsubscribe(self) -> None:
        """Leave the group; the revoke callback runs now, on this thread."""
        self._check_open()
        self._leave_group()
        with self._cond:
            self._subscription = None

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
        deadline = _deadline(timeout)
        self._touch()
        try:
            while True:
                with self._cond:
                    self._check_open()
                    self._broker._tick_locked()
                    results = list(self._commit_results)
                    self._commit_results.clear()
                    action = None
                    if self._member is not None:
                        action = self._broker._next_action_locked(self._member)
                    if action is None and not results:
                        out: list[Any] = list(self._pending_errors)
                        self._pending_errors.clear()
                        out.extend(self._fetch_locked(num_messages - len(out)))
                        self._maybe_auto_commit_locked()
                        if out or num_messages == 0:
                            return out
                        wait = _remaining(deadline)
                        if wait <= 0:
                            return []
                        self._set_waiting(True)
                        try:
                            self._cond.wait(min(wait, _WAIT_SLICE))
                        finally:
                            self._set_waiting(False)
                        continue
                # Callbacks run without the lock, on this thread, as librdkafka serves them.
                self._serve_commit_results(results)
                if action is not None:
                    self._run_rebalance(*action)
        finally:
            self._touch()

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

    def _fetch_locked(self, limit: int) -> list[MemoryMessage]:
        out: list[MemoryMessage] = []
        if limit <= 0:
            return out
        parts = sorted(tp for tp, f in self._assignment.items() if not f.paused)
        if not parts:
            return out
        # Start at a rotating partition so that no partition starves the others.
        self._rotation = (self._rotation + 1) % len(parts)
        for tp in parts[self._rotation :] + parts[: self._rotation]:
            topic = self._broker._topics.get(tp[0])
            if topic is None or tp[1] >= len(topic):
                continue
            log_ = topic[tp[1]]
            f = self._assignment[tp]
            if f.position is None:
                continue
            if f.position > len(log_):  # out of range: reset, as librdkafka does
                f.position = 0 if self._reset == "earliest" else len(log_)
            while f.position < len(log_) and len(out) < limit:
                out.append(_message(tp[0], tp[1], f.position, log_[f.position]))
                f.position += 1
                f.app_position = f.position
                f.eof_sent = False
                if self._auto_store:
                    self._stored[tp] = f.position
            if self._eof and f.position == len(log_) and not f.eof_sent and len(out) < limit:
                f.eof_sent = True
                out.append(
                    MemoryMessage(
                        tp[0],
                        tp[1],
                        f.position,
                        error=_error(
                            KafkaError._PARTITION_EOF, f"Broker: No more messages ({_tp_name(tp)})"
                        ),
                    )
                )
            if len(out) >= limit:
                break
        return out

    # -- rebalance callbacks --------------------------------------------------------------
    def _run_rebalance(
        self, kind: str, parts: list[_TP], *, rejoin: bool = True, release: bool = True
    ) -> None:
        """Run one rebalance callback, then sync the assignment like confluent-kafka does."""
        cooperative = self._broker._groups[self._group_id].protocol == "cooperative"
        tps = _tps(parts)
        if kind == "assign":
            cb = self._on_assign
        elif kind == "lost":
            cb = self._on_lost or self._on_revoke
        else:
            cb = self._on_revoke
            if self._auto_commit:  # librdkafka commits stored offsets before a revoke
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
                    g = self._broker._groups[self._group_id]
                    if kind == "revoke" and release:
                        released = self._broker._release_locked(g, member, parts)
                        self._broker._record_locked(g.name, member.member_id, "revoke", released)
                        if g.protocol == "cooperative" and rejoin:
                            # KIP-429: the revoking member rejoins and a second rebalance hands
                            # the freed partitions over; every member sees it (on_assign, maybe
                            # with an empty list), as with librdkafka.
                            self._broker._rebalance_locked(g)
                    elif (
                        kind == "lost"
                        and rejoin
                        and not member.fenced
                        and self._subscription is not None
                    ):
                        # librdkafka rejoins the group after a lost assignment (but a fenced
                        # static member is done: that error is fatal).
                        self._member = self._broker._join_locked(self, self._subscription)
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
            parts = sorted(member.owned) if not member.lost else sorted(self._assignment)
            kind = "lost" if member.lost else "revoke"
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
                    self._broker._depart_locked(member)
                else:
                    self._broker._leave_locked(member)
                self._member = None

    # -- assignment ---------------------------------------------------------------------
    def _start_position_locked(self, tp: _TP, offset: int) -> int | None:
        topic = self._broker._topics.get(tp[0], [])
        high = len(topic[tp[1]]) if tp[1] < len(topic) else 0
        if offset >= 0:
            return offset
        if offset == OFFSET_BEGINNING:
            return 0
        if offset == OFFSET_END:
            return high
        committed = self._broker._group_locked(self._group_id).committed.get(tp)
        if committed is not None:
            return committed
        if self._reset == "earliest":
            return 0
        if self._reset == "latest":
            return high
        self._pending_errors.append(
            MemoryMessage(
                tp[0],
                tp[1],
                OFFSET_INVALID,
                error=_error(
                    KafkaError._AUTO_OFFSET_RESET,
                    f"no committed offset for {_tp_name(tp)} and auto.offset.reset=error",
                ),
            )
        )
        return None

    def _check_protocol(self, incremental: bool) -> None:
        with self._cond:
            g = self._broker._groups.get(self._group_id)
            protocol = g.protocol if (g is not None and self._subscribed) else None
        if protocol == "cooperative" and not incremental:
            _raise(
                KafkaError._STATE,
                "Changes to the current assignment must be made using incremental_assign() or "
                "incremental_unassign() when rebalance protocol type is COOPERATIVE",
            )
        if protocol == "eager" and incremental:
            _raise(
                KafkaError._STATE,
                "Changes to the current assignment must be made using assign() when rebalance "
                "protocol type is EAGER",
            )

    def _assign_impl(self, partitions: list[Any]) -> None:
        with self._cond:
            self._assignment = {}
            self._stored = {}
            for tp in partitions:
                key = (tp.topic, tp.partition)
                self._assignment[key] = _Fetch(self._start_position_locked(key, tp.offset))
            self._cond.notify_all()

    def _unassign_impl(self) -> None:
        with self._cond:
            self._assignment = {}
            self._stored = {}

    def _incremental_assign_impl(self, partitions: list[Any]) -> None:
        with self._cond:
            keys = [(tp.topic, tp.partition) for tp in partitions]
            dup = [k for k in keys if k in self._assignment]
            if dup:
                _raise(
                    KafkaError._CONFLICT,
                    f"{_tp_name(dup[0])} is already part of the current assignment",
                )
            for tp, key in zip(partitions, keys, strict=True):
                self._assignment[key] = _Fetch(self._start_position_locked(key, tp.offset))
            self._cond.notify_all()

    def _incremental_unassign_impl(self, partitions: list[Any], strict: bool = True) -> None:
        with self._cond:
            keys = [(tp.topic, tp.partition) for tp in partitions]
            missing = [k for k in keys if k not in self._assignment]
            if missing and strict:
                _raise(
                    KafkaError._INVALID_ARG,
                    f"{_tp_name(missing[0])} is not part of the current assignment",
                )
            for key in keys:
                self._assignment.pop(key, None)
                self._stored.pop(key, None)

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
            return _tps(self._assignment)

    def pause(self, partitions: list[Any]) -> None:
        """Stop returning records of these partitions; unassigned ones are ignored."""
        self._check_open()
        with self._cond:
            for tp in partitions:
                f = self._assignment.get((tp.topic, tp.partition))
                if f is not None:
                    f.paused = True

    def resume(self, partitions: list[Any]) -> None:
        self._check_open()
        with self._cond:
            for tp in partitions:
                f = self._assignment.get((tp.topic, tp.partition))
                if f is not None:
                    f.paused = False
            self._cond.notify_all()

    def seek(self, partition: Any) -> None:
        self._check_open()
        with self._cond:
            key = (partition.topic, partition.partition)
            f = self._assignment.get(key)
            if f is None:
                _raise(
                    KafkaError._STATE,
                    f"Failed to seek: {_tp_name(key)} is not assigned to this consumer",
                )
            f.position = self._start_position_locked(key, partition.offset)
            f.app_position = None
            f.eof_sent = False
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
                f = self._assignment.get((tp.topic, tp.partition))
                pos = f.app_position if f is not None else None
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
                    _raise(
                        KafkaError._STATE,
                        f"StoreOffsets failed: {t}[{p}] is not assigned to this consumer",
                    )
                self._stored[(t, p)] = o

    def _offsets_from(self, message: Any, offsets: list[Any] | None) -> list[tuple[str, int, int]]:
        if offsets is not None:
            return [(tp.topic, tp.partition, tp.offset) for tp in offsets]
        if message.error() is not None:
            _raise(
                KafkaError._INVALID_ARG,
                f"Cannot commit offsets for message with error: '{message.error().str()}'",
            )
        return [(message.topic(), message.partition(), message.offset() + 1)]

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
                    (t, p, o) for (t, p), o in self._stored.items() if (t, p) in self._assignment
                ]
        # Logical offsets (negative) are not committed, as in librdkafka.
        valid = [(t, p, o) for t, p, o in entries if o >= 0]
        with self._cond:
            self._check_open()
            if valid:
                err = self._broker._commit_locked(self, valid)
            else:
                err = _error(KafkaError._NO_OFFSET, "Local: No offset stored")
            result = [TopicPartition(t, p, o) for t, p, o in valid]
            if asynchronous:
                if self._on_commit is not None:
                    self._commit_results.append((err, result))
                    self._cond.notify_all()
                return None
        if err is not None:
            raise KafkaException(err)
        return result

    def _auto_commit_locked(self, parts: set[_TP] | None = None) -> None:
        member = self._member
        if member is None or member.lost:
            return
        offsets = [
            (t, p, o)
            for (t, p), o in self._stored.items()
            if (t, p) in member.owned
            and (parts is None or (t, p) in parts)
            and self._broker._groups[self._group_id].committed.get((t, p)) != o
        ]
        if offsets:
            err = self._broker._commit_locked(self, offsets)
            if self._on_commit is not None:
                self._commit_results.append((err, [TopicPartition(t, p, o) for t, p, o in offsets]))
        self._last_auto_commit = time.monotonic()

    def _maybe_auto_commit_locked(self) -> None:
        if (
            self._auto_commit
            and time.monotonic() - self._last_auto_commit >= self._auto_commit_interval
        ):
            self._auto_commit_locked()

    def _serve_commit_results(self, results: list[tuple[KafkaError | None, list[Any]]]) -> None:
        if self._on_commit is None:
            return
        for err, tps in results:
            self._on_commit(err, tps)

    def committed(self, partitions: list[Any], timeout: float | None = None) -> list[Any]:
        self._check_open()
        with self._cond:
            g = self._broker._groups.get(self._group_id)
            stored = g.committed if g else {}
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
            self._broker._tick_locked()
            topic = self._broker._topics.get(key[0])
            if topic is None or key[1] >= len(topic):
                if cached:
                    return (OFFSET_INVALID, OFFSET_INVALID)
                _raise(
                    KafkaError.UNKNOWN_TOPIC_OR_PART,
                    f"Failed to get watermark offsets: {_tp_name(key)} does not exist",
                )
            if cached and key not in self._assignment:
                # librdkafka only caches watermarks of partitions it fetches.
                return (OFFSET_INVALID, OFFSET_INVALID)
            return (0, len(topic[key[1]]))

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self._check_open()
        return _metadata(self._broker, topic)

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
                self._assignment = {}
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
                    self._broker._depart_locked(member)
                else:
                    self._broker._expel_locked(member, "worker killed")
            self._commit_results.clear()
            self._cond.notify_all()


# -- producer ---------------------------------------------------------------------------------


class MemoryProducer:
    """A producer to the memory broker that behaves like ``confluent_kafka.Producer``."""

    def __init__(self, broker: MemoryBroker, config: Mapping[str, Any]) -> None:
        self._broker = broker
        self._cond = broker._cond
        self._default_callback: DeliveryCallback | None = config.get("on_delivery")
        timeout_key = (
            "delivery.timeout.ms" if "delivery.timeout.ms" in config else "message.timeout.ms"
        )
        self._message_timeout = _conf_ms(config, timeout_key, 300_000)
        self._max_queue = int(config.get("queue.buffering.max.messages", 100_000))
        self._outstanding = 0  # produced and not yet reported to the app
        self._ready: deque[_Delivery] = deque()
        self._killed = False

    def _check_open(self) -> None:
        if self._killed:
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
        entry = _Entry(
            _to_bytes(key, "key"),
            _to_bytes(value, "value"),
            _headers(headers),
            timestamp or _now_ms(),
        )
        cb = on_delivery or callback or self._default_callback
        with self._cond:
            if self._outstanding >= self._max_queue:
                raise BufferError("Local: Queue full")
            self._broker._tick_locked()
            if topic not in self._broker._topics:
                if not self._broker._auto_create:
                    _raise(KafkaError._UNKNOWN_TOPIC, f"Local: Unknown topic: {topic}")
                self._broker._create_topic_locked(topic, self._broker._default_partitions)
            p = self._broker._choose_partition_locked(topic, entry.key, partition)
            d = _Delivery(self, topic, p, entry, cb, time.monotonic() + self._message_timeout)
            self._outstanding += 1
            failures = self._broker._failures.get(topic)
            if failures:
                d.error = failures.popleft()
                self._completed_locked(d)
            elif topic in self._broker._stalls:
                self._broker._in_transit.append(d)
            else:
                d.offset = self._broker._append_locked(topic, p, entry)
                self._completed_locked(d)

    def _completed_locked(self, d: _Delivery) -> None:
        self._ready.append(d)
        self._cond.notify_all()

    def poll(self, timeout: float = -1) -> int:
        """Serve delivery callbacks; waits up to ``timeout`` for one. Returns how many ran."""
        self._check_open()
        deadline = _deadline(timeout)
        while True:
            with self._cond:
                self._check_open()
                self._broker._tick_locked()
                ready = list(self._ready)
                self._ready.clear()
                if not ready:
                    wait = _remaining(deadline)
                    if wait <= 0:
                        return 0
                    self._cond.wait(min(wait, _WAIT_SLICE))
                    continue
            self._serve(ready)
            return len(ready)

    def _serve(self, ready: list[_Delivery]) -> None:
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
                    self._ready.extendleft(reversed(ready[i + 1 :]))
                raise

    def flush(self, timeout: float = -1) -> int:
        """Wait until every message is reported (or the timeout); returns how many are left."""
        self._check_open()
        deadline = _deadline(timeout)
        while True:
            self.poll(0)
            with self._cond:
                if self._outstanding == 0:
                    return 0
                wait = _remaining(deadline)
                if wait <= 0:
                    return self._outstanding
                if not self._ready:
                    self._cond.wait(min(wait, _WAIT_SLICE))

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        """Fail undelivered (stalled) messages with ``_PURGE_QUEUE``; served by poll()."""
        self._check_open()
        with self._cond:
            keep = []
            for d in self._broker._in_transit:
                if d.producer is self and in_queue:
                    d.error = _error(KafkaError._PURGE_QUEUE, "Local: Purged in queue")
                    self._completed_locked(d)
                else:
                    keep.append(d)
            self._broker._in_transit = keep

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self._check_open()
        return _metadata(self._broker, topic)

    def __len__(self) -> int:
        self._check_open()
        with self._cond:
            self._broker._tick_locked()
            return self._outstanding

    def _kill(self) -> None:
        """SIGKILL: messages not yet written are gone, reports are never served."""
        with self._cond:
            self._killed = True
            self._broker._in_transit = [
                d for d in self._broker._in_transit if d.producer is not self
            ]
            self._ready.clear()
            self._cond.notify_all()


def _metadata(broker: MemoryBroker, only: str | None) -> Any:
    md: Any = ClusterMetadata()
    md.cluster_id = "memory"
    md.controller_id = 0
    b: Any = BrokerMetadata()
    b.id, b.host, b.port = 0, "memory", 9092
    md.brokers = {0: b}
    with broker._cond:
        names = [only] if only is not None else sorted(broker._topics)
        for name in names:
            t: Any = TopicMetadata()
            t.topic = name
            parts = broker._topics.get(name)
            if parts is None:
                t.error = _error(
                    KafkaError.UNKNOWN_TOPIC_OR_PART, f"Broker: Unknown topic or partition: {name}"
                )
                parts = []
            for i in range(len(parts)):
                pm: Any = PartitionMetadata()
                pm.id, pm.leader, pm.replicas, pm.isrs = i, 0, [0], [0]
                t.partitions[i] = pm
            md.topics[name] = t
    return md


# -- client factory ---------------------------------------------------------------------------


class MemoryClients:
    """The :class:`~offtake.kafka.protocols.ClientFactory` of one worker on a memory broker."""

    def __init__(self, broker: MemoryBroker, name: str = "") -> None:
        self.broker = broker
        self.name = name
        self.consumers: list[MemoryConsumer] = []
        self.producers: list[MemoryProducer] = []
        self.killed = False

    def consumer(self, config: dict[str, Any]) -> MemoryConsumer:
        if self.killed:
            raise ClientKilled("this worker was killed by the test harness")
        conf = dict(config)
        if self.name and "client.id" not in conf:
            conf["client.id"] = self.name
        c = MemoryConsumer(self.broker, conf)
        self.consumers.append(c)
        return c

    def producer(self, config: dict[str, Any]) -> MemoryProducer:
        if self.killed:
            raise ClientKilled("this worker was killed by the test harness")
        p = MemoryProducer(self.broker, config)
        self.producers.append(p)
        return p

    def topic_partition(self, topic: str, partition: int, offset: int = OFFSET_INVALID) -> Any:
        return TopicPartition(topic, partition, offset)

    def kill(self) -> None:
        """Abandon every client made here as SIGKILL would: no revoke, commit, flush or leave.

        The broker removes the consumers from their groups at once (their partitions are
        lost, and the other members take them over without any revoke by this one), drops
        messages its producers had not written yet, and every later call on these clients
        raises :class:`ClientKilled`.
        """
        self.killed = True
        for c in self.consumers:
            c._kill()
        for p in self.producers:
            p._kill()


if TYPE_CHECKING:

    def _conforms(broker: MemoryBroker) -> ClientFactory:
        # mypy checks here that the memory clients satisfy the engine's protocols.
        return broker.clients()
