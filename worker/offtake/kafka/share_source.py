"""The share source: the one owner of a queue-mode worker's Kafka share consumer (KIP-932).

A share group hands out records, not partitions: every member fetches from every partition,
and each record it receives is *acquired* (locked to it) until it acknowledges it (ACCEPT:
done; RELEASE: give it back for another delivery; REJECT: archive it, never delivered again)
or until the lock expires (``share.record.lock.duration.ms``, 30 s by default), when the
broker delivers it again, counting deliveries. :class:`ShareSource` speaks Offtake's types:
records in, :class:`Ack` kinds out.

Explicit acknowledgement (``share.acknowledgement.mode=explicit``) has one rule that shapes
this class: every record of a poll must be acknowledged before the next poll (confluent-kafka
raises IllegalStateException otherwise). So :meth:`consume` polls only when the last poll's
records are all acknowledged and returns nothing meanwhile; acknowledgements are local until
:meth:`flush` (or the next poll) sends them.

The client cannot renew a lock (confluent-kafka 2.16 has no RENEW acknowledgement): what the
worker cannot finish within the lock, it gives back deliberately with :meth:`release_expiring`
before the lock runs out, instead of acknowledging it too late (the broker answers
INVALID_RECORD_STATE, and the record was delivered again meanwhile); late acknowledgements that
still happen are counted (:attr:`ShareStats.late`).

Threading: like :class:`~offtake.kafka.source.KafkaSource`, every method runs on the worker's
poll thread; the share consumer is not thread-safe (a call from another thread raises).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import sys
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from offtake.kafka.protocols import ClientFactory, ConsumerLike, MessageLike, ShareConsumerLike
from offtake.kafka.source import SourceFatal, SourceListener, StartPosition
from offtake.records import TopicPartition

log = logging.getLogger("offtake.share")

#: The broker's default acquisition lock, when the group's own cannot be read.
DEFAULT_LOCK_SECONDS = 30.0
#: Give back what is still unfinished this long before its lock expires: the release must
#: reach the broker before the lock runs out, and a poll cycle can take this long.
RELEASE_MARGIN_SECONDS = 5.0
#: How often the backlog's log ends are asked (a round trip per partition, on the poll thread).
BACKLOG_INTERVAL_SECONDS = 5.0
#: What one refresh of the log ends may take in all, so acknowledging never waits long on it.
BACKLOG_BUDGET_SECONDS = 1.0
#: The share consumer's max.poll.records unless spec.kafka.config sets it: the records the
#: broker may acquire for one ShareFetch (librdkafka sends it as the request's max records).
#: At librdkafka's 500 the broker answers with one partition's batches a fetch (about 2,000
#: records, whole batches, capped per partition by the group's
#: share.partition.max.record.locks), and a worker that must acknowledge a poll before the
#: next waits for a fetch round trip every 2,000 records. 10,000 lets one fetch carry several
#: partitions: a consume-only share-consumer loop made 19 polls of 200,000 records instead of
#: 42, at 1.4x to 1.75x the rate (docs/bench.md, "issue 39 item 2").
POLL_RECORDS = 10_000
_UNSUPPORTED_VERSION = 35  # the ShareGroupHeartbeat of a broker without share groups
_INVALID_RECORD_STATE = 121  # the broker's answer to an acknowledgement after the lock expired
_FATAL = -150
CLOSE_COMMIT_TIMEOUT = 10.0


def release_after(lock_seconds: float, margin: float = RELEASE_MARGIN_SECONDS) -> float:
    """How long after its poll a record still unfinished is released: ``margin`` before the
    lock runs out, a quarter of the lock when that is shorter (a short lock still gets most of
    its time)."""
    return lock_seconds - min(margin, lock_seconds / 4)


def call_outlives_lock(
    timeout_seconds: float, where: str, lock_seconds: float = DEFAULT_LOCK_SECONDS
) -> str | None:
    """``offtake validate``'s warning when a call allowed ``timeout_seconds`` (the field
    ``where``) outlives what the lock leaves it; None when it fits. No RENEW (KIP-1222) in
    confluent-kafka 2.16: a lock cannot be extended, so such a call's record is released and
    processed again by another worker."""
    budget = release_after(lock_seconds)
    if timeout_seconds <= budget:
        return None
    return (
        f"warning: {where} {timeout_seconds:g} s is longer than a record's acquisition lock "
        f"allows: the worker releases a record still unfinished {budget:g} s after its poll "
        f"(the lock, share.record.lock.duration.ms, is {lock_seconds:g} s by default), another "
        "worker then processes it again, and a record that always takes that long ends in "
        "errors.policy after its deliveries. confluent-kafka cannot renew a lock (no RENEW, "
        "KIP-1222): raise the group's share.record.lock.duration.ms (the broker caps it at "
        "group.share.max.record.lock.duration.ms, 60 s by default) or lower the timeout "
        "(docs/queue-mode.md, Acquisition locks)"
    )


class Ack(enum.IntEnum):
    """How a record is acknowledged; the values are confluent_kafka.AcknowledgeType's."""

    ACCEPT = 1
    RELEASE = 2
    REJECT = 3


class ShareGroupUnavailable(SourceFatal):
    """The brokers (or this client) do not serve share groups; names spec.source.groupType."""


@dataclass
class ShareStats:
    """What the source counts for the metrics (read by the engine after each call)."""

    acquired: int = 0
    acknowledged: dict[Ack, int] = field(default_factory=lambda: dict.fromkeys(Ack, 0))
    #: Records delivered again (delivery count > 1): released, or a lock that expired.
    redelivered: int = 0
    #: Acknowledgements the broker refused because the lock had expired meanwhile.
    late: int = 0
    #: Records given back before their lock expired (see release_expiring).
    released_before_expiry: int = 0


@dataclass(frozen=True)
class ShareGroupSettings:
    """The group configuration the worker sets when it starts (AdminClient, GROUP resource)."""

    #: startFrom: a share group starts at the log end unless told otherwise.
    auto_offset_reset: str
    #: The broker archives a record after this many deliveries: maxRetries + 2, so that the
    #: worker's own last attempt (delivery maxRetries + 1) comes first, and a record whose
    #: processing killed a worker on that attempt is delivered once more, straight to policy.
    delivery_count_limit: int

    def as_config(self) -> dict[str, str]:
        return {
            "share.auto.offset.reset": self.auto_offset_reset,
            "share.delivery.count.limit": str(self.delivery_count_limit),
        }


#: The broker's bounds on share.delivery.count.limit (group.share.min/max.delivery.count.limit).
MIN_DELIVERY_LIMIT = 2
MAX_DELIVERY_LIMIT = 10


def group_settings(start_from: str, max_retries: int) -> ShareGroupSettings:
    """The group settings for a pipeline; the loader keeps ``max_retries`` within bounds."""
    limit = min(MAX_DELIVERY_LIMIT, max(MIN_DELIVERY_LIMIT, max_retries + 2))
    return ShareGroupSettings(start_from, limit)


class ShareSource:
    """Owns one share consumer subscribed to the pipeline's topics; see the module docstring."""

    def __init__(
        self,
        clients: ClientFactory,
        config: dict[str, Any],
        topics: list[str],
        settings: ShareGroupSettings,
        clock: Callable[[], float] = time.monotonic,
        make_probe: Callable[[], ConsumerLike] | None = None,
    ) -> None:
        self._clients = clients
        # A group-less consumer that only asks log ends: a share consumer has no watermarks.
        self._make_probe = make_probe
        self._probe: ConsumerLike | None = None
        self._backlog_at = -BACKLOG_INTERVAL_SECONDS
        self._config = dict(config)
        self._topics = topics
        self._settings = settings
        self._clock = clock
        #: How consume() waits while a poll is out: until the processing thread settles
        #: records, which is what lets the next poll come (the engine sets it; a sleep else).
        self.idle_wait: Callable[[float], None] = time.sleep
        self._consumer: ShareConsumerLike | None = None
        self._fatal: str | None = None
        # The last poll's records not yet acknowledged, per partition by offset; all were
        # acquired at _polled_at (one poll at a time), so their locks run out together.
        self._open: dict[tuple[str, int], dict[int, MessageLike]] = {}
        self._held = 0  # the records in _open
        self._polled_at = 0.0
        self._unsent = False  # acknowledgements recorded locally, not yet sent
        self._listener: SourceListener | None = None
        self._seen: set[TopicPartition] = set()  # partitions the listener heard of
        self._acquired_by_topic: dict[str, int] = {}
        #: Per partition, the age (s) of its oldest record in the last poll when acquired: how
        #: far behind the share group is (0 for partitions a poll brought nothing of).
        self.acquired_ages: dict[TopicPartition, float] = {}
        #: Per partition, the highest offset this worker acquired: its acquisition frontier.
        self.frontier: dict[TopicPartition, int] = {}
        #: Per partition, the records past the frontier: log end - (frontier + 1), an estimate
        #: (see refresh_backlog).
        self.backlog: dict[TopicPartition, int] = {}
        self.lock_seconds = DEFAULT_LOCK_SECONDS
        self.stats = ShareStats()
        #: Goes up whenever acquired_ages, frontier or backlog changed (a poll with records, a
        #: refresh of the log ends): the gauges made from them need setting only then.
        self.revision = 0

    # -- life cycle ------------------------------------------------------------------------
    def open(self, listener: SourceListener) -> None:
        """Set the group's configuration, create the share consumer and subscribe.

        A share group assigns no partitions to wait for: the listener hears of an empty
        assignment at once (the worker is ready), and of each partition when its first record
        arrives (so the engine tracks it). Raises :class:`ShareGroupUnavailable` when the
        brokers refuse the group's configuration or the client has no ShareConsumer.
        """
        self._listener = listener
        group = str(self._config["group.id"])
        try:
            lock_ms = self._clients.configure_share_group(
                self._config, group, self._settings.as_config()
            )
        except Exception as exc:
            raise ShareGroupUnavailable(
                f"the brokers refused share group {group!r}'s configuration ({exc}): "
                "spec.source.groupType share needs Kafka 4.2 or later with share groups "
                "enabled (feature share.version=1)"
            ) from exc
        if lock_ms:
            self.lock_seconds = lock_ms / 1000
        conf = dict(self._config)
        conf["share.acknowledgement.mode"] = "explicit"
        conf.setdefault("max.poll.records", POLL_RECORDS)
        conf.setdefault("error_cb", self._on_client_error)
        self._consumer = self._clients.share_consumer(conf)
        self._consumer.set_acknowledgement_commit_callback(self._on_acknowledged)
        self._consumer.subscribe(list(self._topics))
        listener.assigned({})

    def close(self, leave_timeout: float = CLOSE_COMMIT_TIMEOUT) -> None:
        """Release every record acquired and not acknowledged, send what is pending, close.

        Released records go to other members at once, with no wait for a lock: a graceful
        stop duplicates nothing it had not delivered. The caller bounds this under the
        watchdog, as for the consumer-group source.
        """
        if self._consumer is None:
            return
        try:
            self.release_all()
            if self._unsent:
                self._consumer.commit_sync(max(1.0, leave_timeout))
                self._unsent = False
            self._consumer.close()
        except:  # noqa: E722 -- confluent-kafka can raise a bare KafkaError (no BaseException)
            log.warning("closing the share consumer failed: %s", sys.exc_info()[1])
        if self._probe is not None:
            probe, self._probe = self._probe, None
            with contextlib.suppress(Exception):
                probe.close()

    # -- fetching --------------------------------------------------------------------------
    def consume(self, max_records: int, timeout: float) -> list[MessageLike]:
        """The records of one poll (``max_records`` is the share consumer's max.poll.records,
        not this call's), in partition and offset order, once every record of the previous
        poll is acknowledged; until then nothing, after ``timeout``.

        Raises :class:`SourceFatal` once the client reported an error it cannot recover from.
        """
        if self._fatal is not None:
            raise SourceFatal(self._fatal)
        if self._held:
            self.idle_wait(timeout)  # the processing thread's progress is what ends this wait
            return []
        try:
            got = self._c.poll(timeout)
        except Exception as exc:  # KafkaException: the first poll joins the group
            self._refused(exc)
            log.warning("share consumer: %s", exc)
            return []
        self._unsent = False  # the poll sent the acknowledgements recorded before it
        self._polled_at = self._clock()
        runs = self._runs(got)
        if not runs:
            return []
        out: list[MessageLike] = []
        redelivered = 0
        count = _delivery_count_of(next(iter(runs.values()))[0])
        ages = dict.fromkeys(self.acquired_ages, 0.0)  # 0 for partitions this poll missed
        now = time.time()
        for where in sorted(runs):  # the engine's unit is a partition's records in offset order
            run = runs[where]
            offsets = [m.offset() or 0 for m in run]
            if offsets != sorted(offsets):
                pairs = sorted(zip(offsets, run, strict=True), key=_first)
                offsets, run = [o for o, _ in pairs], [m for _, m in pairs]
            self._open[where] = dict(zip(offsets, run, strict=True))
            if count is not None:
                redelivered += len([m for m in run if (count(m) or 1) > 1])
            ages[TopicPartition(*where)] = self._track(where, run, offsets[-1], now)
            out.extend(run)
        self._held = len(out)
        self.stats.redelivered += redelivered
        self.stats.acquired += len(out)
        self.acquired_ages = ages
        self.revision += 1
        new = [tp for tp in ages if tp not in self._seen]
        if new and self._listener is not None:
            self._seen.update(new)
            self._listener.assigned({tp: StartPosition(None, False) for tp in new})
        return out

    def _runs(self, got: Any) -> dict[tuple[str, int], list[MessageLike]]:
        """A poll's records per partition, in one pass with one lookup per run of a partition
        (a poll holds each partition's records together); errors are noted, not returned."""
        runs: dict[tuple[str, int], list[MessageLike]] = {}
        last: tuple[str, int] | None = None
        run: list[MessageLike] = []
        for msg in got:
            err = msg.error()
            if err is not None:
                if err.fatal() or err.code() == _FATAL:
                    self._fatal = self._fatal or f"fatal Kafka error: {err.str()}"
                else:
                    log.warning("share consumer error: %s", err.str())
                continue
            where = (msg.topic() or "", msg.partition() or 0)
            if where != last:
                run = runs.setdefault(where, [])
                last = where
            run.append(msg)
        return runs

    def _track(
        self, where: tuple[str, int], run: list[MessageLike], last: int, now: float
    ) -> float:
        """Note one partition's run of a poll (once per run, not per record): its frontier
        (the run's last offset) and its records per topic; returns the age (s) of its first
        record in offset order when acquired (the oldest, unless producers stamp records out
        of order)."""
        tp = TopicPartition(*where)
        self._acquired_by_topic[where[0]] = self._acquired_by_topic.get(where[0], 0) + len(run)
        self.frontier[tp] = max(last, self.frontier.get(tp, -1))
        kind, ts = run[0].timestamp()
        return max(0.0, now - ts / 1000) if kind and ts >= 0 else 0.0

    def refresh_backlog(self) -> None:
        """Every BACKLOG_INTERVAL_SECONDS, the backlog of each partition this worker acquired
        from: its log end (asked of the broker by a group-less probe consumer, within
        BACKLOG_BUDGET_SECONDS in all) minus the frontier + 1.

        An estimate, and this worker's: the group's frontier is the furthest of its workers'
        (so the group's backlog is the smallest of theirs); records released or whose lock
        expired are delivered again from behind the frontier and are not counted, nor are
        records acquired and not yet acknowledged. A partition whose log end does not answer
        keeps its last value."""
        now = self._clock()
        if self._make_probe is None or not self.frontier:
            return
        if now - self._backlog_at < BACKLOG_INTERVAL_SECONDS:
            return
        self._backlog_at = now
        if self._probe is None:
            self._probe = self._make_probe()
        deadline = time.monotonic() + BACKLOG_BUDGET_SECONDS
        for tp, offset in sorted(self.frontier.items()):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                marks = self._probe.get_watermark_offsets(
                    self._clients.topic_partition(tp.topic, tp.partition),
                    timeout=left,
                    cached=False,
                )
            except Exception as exc:  # KafkaException: the broker did not answer in time
                log.debug("log end of %s[%d]: %s", tp.topic, tp.partition, exc)
                continue
            if marks is not None and marks[1] >= 0:
                self.backlog[tp] = max(0, int(marks[1]) - offset - 1)
                self.revision += 1

    # -- what a share group has no use for (the poll loop's calls for consumer groups) -------
    def pause(self, partitions: Collection[TopicPartition]) -> None:
        """No pausing: a poll's records are acknowledged before the next poll, which bounds
        what is in flight to one poll."""

    def resume(self, partitions: Collection[TopicPartition]) -> None:
        """Nothing was paused (see :meth:`pause`)."""

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """A share group has no position to move (errors.retryTopics is refused with it)."""

    def log_end(self, tp: TopicPartition) -> int | None:
        """None: lag in queue mode is :attr:`acquired_ages`, not offsets."""
        return None

    def oldest_timestamp(self, tp: TopicPartition, offset: int) -> int | None:
        return None

    @property
    def acquired(self) -> int:
        """Records acquired by the last poll and not acknowledged yet."""
        return self._held

    @staticmethod
    def _refused(exc: Exception) -> None:
        """Raise for an error the worker cannot go on after; return for a passing one."""
        if _code(exc) == _UNSUPPORTED_VERSION:
            raise ShareGroupUnavailable(
                f"the brokers do not serve share groups ({exc}): spec.source.groupType share "
                "needs Kafka 4.2 or later with share groups enabled (feature share.version=1)"
            ) from exc
        inner: Any = exc.args[0] if exc.args else None
        if not callable(getattr(inner, "fatal", None)) or inner.fatal():
            raise SourceFatal(f"fatal Kafka error: {exc}") from exc

    # -- acknowledging ---------------------------------------------------------------------
    def acknowledge(self, tp: TopicPartition, offset: int, kind: Ack) -> bool:
        """Record how one acquired record ends; sent with the next :meth:`flush` or poll.
        False if it is not (or no longer) held here: released already, say."""
        return self.acknowledge_many(tp, (offset,), kind) == 1

    def acknowledge_many(self, tp: TopicPartition, offsets: Iterable[int], kind: Ack) -> int:
        """Record how records of one partition end (see :meth:`acknowledge`); how many were
        held here. One look-up of the partition, then the client's call per record: the poll
        thread's work per record in queue mode."""
        where = (tp.topic, tp.partition)
        held = self._open.get(where)
        if held is None:
            return 0
        pop, ack, how, n = held.pop, self._c.acknowledge, int(kind), 0
        for offset in offsets:
            msg = pop(offset, None)
            if msg is not None:
                ack(msg, how)
                n += 1
        if not held:
            del self._open[where]
        if n:
            self._held -= n
            self.stats.acknowledged[kind] += n
            self._unsent = True
        return n

    def _release_held(self) -> list[tuple[TopicPartition, int]]:
        """Give back every record held; returns them."""
        out: list[tuple[TopicPartition, int]] = []
        for where, held in list(self._open.items()):
            tp = TopicPartition(*where)
            offsets = list(held)
            self.acknowledge_many(tp, offsets, Ack.RELEASE)
            out.extend((tp, offset) for offset in offsets)
        return out

    def release_all(self) -> int:
        """Give back every record held (another member receives them at once); how many."""
        return len(self._release_held())

    def release_expiring(
        self, margin: float = RELEASE_MARGIN_SECONDS
    ) -> list[tuple[TopicPartition, int]]:
        """Release the records whose lock ends within ``margin`` seconds; returns them, so the
        engine forgets them (their outcome, if they finish after all, is not acknowledged)."""
        # Every record held came with the last poll: all expire together, or none. A look at
        # the clock per step, not at every record held (the step runs every few ms).
        if not self._held or self._polled_at > self._clock() - release_after(
            self.lock_seconds, margin
        ):
            return []
        out = self._release_held()
        self.stats.released_before_expiry += len(out)
        return out

    def send_acknowledgements(self, deadline: float) -> None:
        """Send what is recorded and wait for the broker's answer, until ``deadline``
        (time.monotonic()): before leaving the group."""
        if self._unsent:
            self._c.commit_sync(max(1.0, deadline - time.monotonic()))
            self._unsent = False

    def take_acquired_by_topic(self) -> dict[str, int]:
        """Records acquired per topic since the last call (for the metrics)."""
        out, self._acquired_by_topic = self._acquired_by_topic, {}
        return out

    def flush(self) -> None:
        """Send the acknowledgements recorded so far, without waiting for the answer."""
        if self._unsent:
            self._c.commit_async()
            self._unsent = False

    # -- callbacks (served inside poll/commit, on this thread) ------------------------------
    def _on_acknowledged(self, offsets: dict[Any, Any], error: Any) -> None:
        if error is None:
            return
        n = sum(len(v) for v in offsets.values())
        code = _code(error)
        if code == _INVALID_RECORD_STATE:
            self.stats.late += n
            log.warning(
                "%d acknowledgement(s) arrived after the acquisition lock expired (%.0f s): "
                "those records were delivered again",
                n,
                self.lock_seconds,
            )
        else:
            log.warning("acknowledging %d record(s) failed: %s", n, error)

    def _on_client_error(self, err: Any) -> None:
        if getattr(err, "fatal", lambda: False)():
            self._fatal = self._fatal or f"fatal Kafka error: {err}"
        else:
            log.warning("share consumer: %s", err)

    @property
    def _c(self) -> ShareConsumerLike:
        assert self._consumer is not None, "ShareSource.open() was not called"
        return self._consumer


def delivery_count(msg: MessageLike) -> int | None:
    """The broker's delivery count of a share-group record (1 on its first delivery)."""
    count = getattr(msg, "delivery_count", None)
    return count() if callable(count) else None


def first_deliveries(messages: list[MessageLike]) -> bool:
    """Whether each of ``messages`` is on its first delivery (no count, or 1): a Work's records
    then all start at attempt 1, and the processing stage numbers none of them. One C-level
    pass over the counts, not a Python call per record."""
    if not messages:
        return True
    count = _delivery_count_of(messages[0])
    if count is None:
        return True
    counts = list(map(count, messages))
    if None in counts:
        return all((c or 1) <= 1 for c in counts)
    return max(cast("list[int]", counts)) <= 1


def _delivery_count_of(msg: MessageLike) -> Callable[[Any], int | None] | None:
    """The records' delivery_count method, looked up once per poll (None: they have none)."""
    count = getattr(type(msg), "delivery_count", None)
    return count if callable(count) else None


def _first(pair: tuple[int, MessageLike]) -> int:
    return pair[0]


def _code(error: Any) -> int | None:
    inner = error.args[0] if getattr(error, "args", None) else error
    code = getattr(inner, "code", None)
    return code() if callable(code) else None
