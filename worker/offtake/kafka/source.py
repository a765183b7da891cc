"""The source: the one owner of the worker's Kafka consumer.

Everything the engine needs from its consumer goes through :class:`KafkaSource`: subscribing,
the assign/revoke/lost callbacks with their start offsets, fetching, pausing and resuming,
committing, watermarks, and the timestamp of a partition's oldest unread record (for lag in
seconds). It speaks only Offtake's own types (:class:`TopicPartition`, offsets as ints), so no
confluent-kafka object leaks into the engine.

Threading: every method, and every :class:`SourceListener` callback, runs on the thread that
calls :meth:`KafkaSource.consume` (the worker's poll loop). librdkafka serves rebalance and
commit callbacks inside ``consume()``, which is what makes that true. The oldest-record probe
is the exception by design: it has its own consumer on its own thread (see
:mod:`offtake.kafka.oldest_record`), and this class only reads its answers.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

from offtake.errors import OfftakeError
from offtake.kafka.config import log_client_error
from offtake.kafka.oldest_record import OldestRecordProbe
from offtake.kafka.protocols import ClientFactory, ConsumerLike, MessageLike
from offtake.records import TopicPartition

log = logging.getLogger("offtake.source")

OFFSET_STORED = -1000  # librdkafka: start from the committed offset
_PARTITION_EOF = -191  # confluent_kafka.KafkaError._PARTITION_EOF: not an error for us
# confluent_kafka.KafkaError._FATAL: librdkafka's fatal-error event (a fenced static member,
# say). The event's own fatal() is False on real Kafka; its code is what says fatal.
_FATAL = -150
COMMITTED_TIMEOUT = 5.0
LEAVE_TIMEOUT = 10.0  # default bound on leaving the group before close() (see close)
_LEAVE_POLL = 0.1
# Why a commit can be refused now and land a moment later, the member still in the group: a
# rebalance is under way (REBALANCE_IN_PROGRESS 27: the coordinator awaits the leader's
# SyncGroup; ILLEGAL_GENERATION 22: the commit was answered after a join that moved the
# generation on, see docs/worker.md; STALE_MEMBER_EPOCH 113, the same under KIP-848) or the
# coordinator is moving or loading (7, 14, 15, 16; librdkafka's _TIMED_OUT -185, _TRANSPORT
# -195, _WAIT_COORD -180). Not UNKNOWN_MEMBER_ID or FENCED_INSTANCE_ID: the group has moved on
# without this member, and its partitions may belong to another already.
_COMMIT_RETRIABLE = frozenset({7, 14, 15, 16, 22, 27, 113, -185, -195, -180})


class SourceFatal(OfftakeError):
    """A fatal Kafka error: the consumer cannot go on (fenced, authentication, ...)."""


class CommitRefused(OfftakeError):
    """A commit the broker (or librdkafka) refused; the message is Kafka's own.

    ``retriable``: a rebalance or a coordinator move explains it, and the same commit can land
    once that is over (see ``_COMMIT_RETRIABLE``).
    """

    def __init__(self, reason: str, retriable: bool) -> None:
        super().__init__(reason)
        self.retriable = retriable

    @classmethod
    def of(cls, error: Any) -> CommitRefused:
        """From a KafkaError (or whatever else a commit raised)."""
        code = error.code() if callable(getattr(error, "code", None)) else None
        return cls(str(error), code in _COMMIT_RETRIABLE)


@dataclass(frozen=True, slots=True)
class StartPosition:
    """Where a newly assigned partition starts, and whether that is a committed offset."""

    offset: int | None  # None: librdkafka applies auto.offset.reset (no offset could be read)
    committed: bool  # True: the group's committed offset; False: resolved from startFrom


class Source(Protocol):
    """What the poll loop uses of a source: :class:`KafkaSource` (a consumer group) or
    :class:`~offtake.kafka.share_source.ShareSource` (a share group, queue mode)."""

    def open(self, listener: SourceListener) -> None: ...
    def close(self, leave_timeout: float = ...) -> None: ...
    def consume(self, max_records: int, timeout: float) -> list[MessageLike]: ...
    def pause(self, partitions: Collection[TopicPartition]) -> None: ...
    def resume(self, partitions: Collection[TopicPartition]) -> None: ...
    def seek(self, tp: TopicPartition, offset: int) -> None: ...
    def log_end(self, tp: TopicPartition) -> int | None: ...
    def oldest_timestamp(self, tp: TopicPartition, offset: int) -> int | None: ...


class SourceListener(Protocol):
    """What the engine does when the group changes; called inside ``consume()``."""

    def assigned(self, starts: dict[TopicPartition, StartPosition]) -> None: ...
    def revoking(self, partitions: set[TopicPartition]) -> None: ...
    def lost(self, partitions: set[TopicPartition]) -> None: ...
    def committed(self, offsets: dict[TopicPartition, int] | None, error: str | None) -> None: ...


class KafkaSource:
    """Owns one consumer subscribed to the pipeline's topics; see the module docstring."""

    def __init__(
        self,
        clients: ClientFactory,
        config: dict[str, Any],
        topics: list[str],
        start_from: str,
        make_probe_consumer: Callable[[], ConsumerLike],
        earliest_topics: Collection[str] = (),
    ) -> None:
        self._clients = clients
        self._config = dict(config)
        self._topics = topics
        self._start_from = start_from
        self._earliest = frozenset(earliest_topics)  # start at the log start whatever startFrom
        self._fatal: str | None = None  # a fatal client error, raised from the next consume()
        self._consumer: ConsumerLike | None = None
        self._listener: SourceListener | None = None
        self._probe = OldestRecordProbe(make_probe_consumer, clients.topic_partition)
        # KIP-345: a static member keeps its partitions while it restarts (see close()).
        self.static = bool(self._config.get("group.instance.id"))
        self._let_go_done = False  # a static member revoked before close(): see _on_revoke
        self.cooperative = "cooperative" in str(
            self._config.get("partition.assignment.strategy", "")
        ) or (str(self._config.get("group.protocol", "")).lower() == "consumer")

    # -- life cycle ------------------------------------------------------------------------
    def open(self, listener: SourceListener) -> None:
        """Create the consumer and subscribe; callbacks go to ``listener`` from now on."""
        self._listener = listener
        conf = dict(self._config)
        conf["on_commit"] = self._on_commit
        conf.setdefault("error_cb", self._on_client_error)
        self._consumer = self._clients.consumer(conf)
        self._consumer.subscribe(
            list(self._topics),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def close(self, leave_timeout: float = LEAVE_TIMEOUT) -> None:
        """Leave the group now (so the others rebalance at once), close, stop the probe.

        The way librdkafka's maintainers advise (#4527), because close() can hang (#4041,
        #4884): when the rebalance callback that close() itself triggers (un)assigns, librdkafka
        can wait forever inside close() while the callback's thread holds the GIL. So the group
        is left first, outside close(): unsubscribe, then consume until nothing is assigned
        (the revoke callback runs inside consume(), where it cannot hang, and the listener
        drains and commits what was delivered, as on any revoke), bounded by
        ``leave_timeout``; then close() has nothing left to revoke. Records consume() returns
        meanwhile are nobody's: they are past the committed offsets, the next owner reads them.

        A static member (``group.instance.id``) does not leave: unsubscribe() would send the
        LeaveGroup that static membership exists to avoid (seen on Kafka 4.3: the other members
        took its partitions at once, and would rebalance again when the pod is back). It
        revokes locally instead, outside close() and any callback: the listener drains and
        commits, then the partitions are unassigned. close() still calls the revoke callback
        with the group's view of the assignment (librdkafka does, static or not), which then
        only unassigns; so for a static member the hang stays possible, but only after the
        commit, and the watchdog bounds it.

        The caller bounds the whole under :mod:`offtake.engine.watchdog`.
        """
        try:
            if self._consumer is not None:
                if self.static:
                    self._let_go(self._consumer)
                else:
                    self._leave(self._consumer, leave_timeout)
                self._consumer.close()
        except:  # noqa: E722 -- confluent-kafka can raise a bare KafkaError (no BaseException)
            log.warning("closing the consumer failed: %s", sys.exc_info()[1])
        finally:
            self._probe.close()

    def _let_go(self, consumer: ConsumerLike) -> None:
        try:
            assigned = consumer.assignment()
            if assigned:
                self._on_revoke(consumer, assigned)
            self._let_go_done = True
        except:  # noqa: E722 -- as in close(): close() must still run
            log.warning("revoking before close failed (%s); closing", sys.exc_info()[1])

    @staticmethod
    def _leave(consumer: ConsumerLike, timeout: float) -> None:
        try:
            if leave_group(consumer, timeout):
                return
            log.warning("partitions still assigned %gs after unsubscribing; closing", timeout)
        except:  # noqa: E722 -- as in close(); a callback's error too: close() must still run
            log.warning("leaving the group failed (%s); closing", sys.exc_info()[1])

    def group_metadata(self) -> Any:
        """The consumer's group metadata, for a transaction's offsets (KIP-447 fencing)."""
        consumer: Any = self._c
        return consumer.consumer_group_metadata()

    @property
    def _c(self) -> ConsumerLike:
        assert self._consumer is not None, "KafkaSource.open() was not called"
        return self._consumer

    # -- fetching --------------------------------------------------------------------------
    def consume(self, max_records: int, timeout: float) -> list[MessageLike]:
        """Up to ``max_records`` records: those fetched already, or, when there are none, the
        first to arrive within ``timeout`` (and any fetched with it). Consumer errors are
        handled here, not returned.

        librdkafka's batch consume returns only once it holds ``max_records`` or the timeout
        has passed, so a single blocking call would hold records that arrived early for up to
        the whole timeout on a topic slower than a batch per timeout: latency for nothing.
        Hence a call that does not wait, and only when it found nothing, a wait for one record.

        Raises :class:`SourceFatal` once librdkafka reported an error it cannot recover from.
        """
        if self._fatal is not None:
            raise SourceFatal(self._fatal)
        n = max(1, max_records)
        got = self._c.consume(num_messages=n, timeout=0)
        if not got and timeout > 0:
            got = self._c.consume(num_messages=1, timeout=timeout)
            if got and n > 1:
                got += self._c.consume(num_messages=n - 1, timeout=0)
        out = [msg for msg in got if msg.error() is None]  # one pass; errors are rare
        if len(out) == len(got):
            return out
        for msg in got:
            err = msg.error()
            if err is None or err.code() == _PARTITION_EOF:
                continue
            if err.fatal() or err.code() == _FATAL:
                self._fatal = self._fatal or f"fatal Kafka error: {err.str()}"
            else:
                log.warning("consumer error: %s", err.str())
        return out

    def pause(self, partitions: Collection[TopicPartition]) -> None:
        if partitions:
            self._c.pause(self._native(partitions))

    def resume(self, partitions: Collection[TopicPartition]) -> None:
        if partitions:
            self._c.resume(self._native(partitions))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Fetch ``tp`` from ``offset`` next (records fetched past it are dropped by librdkafka)."""
        self._c.seek(self._clients.topic_partition(tp.topic, tp.partition, offset))

    # -- offsets ---------------------------------------------------------------------------
    def commit(self, offsets: dict[TopicPartition, int], asynchronous: bool) -> None:
        """Commit offsets; the result reaches ``listener.committed``.

        Raises :class:`CommitRefused` if refused now: an asynchronous commit that cannot be
        sent, or a synchronous one the broker refused, wholly or for some partition (those it
        accepted reach the listener first).
        """
        native = [
            self._clients.topic_partition(tp.topic, tp.partition, offset)
            for tp, offset in offsets.items()
        ]
        try:
            result = self._c.commit(offsets=native, asynchronous=asynchronous)
        except Exception as exc:  # KafkaException, carrying the KafkaError
            raise CommitRefused.of(exc.args[0] if exc.args else exc) from exc
        if not asynchronous and result is not None:
            self._on_commit(None, result)
            refused = [p.error for p in result if getattr(p, "error", None) is not None]
            if refused:
                raise CommitRefused.of(refused[0])

    def log_end(self, tp: TopicPartition) -> int | None:
        """The partition's log-end offset as last fetched (no broker round trip), if known."""
        try:
            marks = self._c.get_watermark_offsets(
                self._clients.topic_partition(tp.topic, tp.partition), timeout=1.0, cached=True
            )
        except Exception:
            return None
        if marks is None or marks[1] < 0:
            return None
        return int(marks[1])

    def oldest_timestamp(self, tp: TopicPartition, offset: int) -> int | None:
        """Timestamp (ms) of the record at ``offset`` if the probe read it; asks it otherwise."""
        return self._probe.timestamp(tp, offset)

    # -- rebalance callbacks (librdkafka calls them inside consume(), on this thread) -------
    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        assert self._listener is not None
        tps = [TopicPartition(p.topic, p.partition) for p in partitions]
        starts = self._start_positions(partitions) if partitions else {}
        if partitions:
            # Assign explicitly (rather than letting librdkafka do it after this callback) so
            # that partitions without a committed offset start exactly where we will commit.
            explicit = [
                self._clients.topic_partition(
                    tp.topic, tp.partition, self._explicit_offset(starts.get(tp))
                )
                for tp in tps
            ]
            if self.cooperative:
                consumer.incremental_assign(explicit)
            else:
                consumer.assign(explicit)  # eager: this is the whole new assignment
        elif self.cooperative:
            consumer.incremental_assign([])  # see _give_back: every callback (un)assigns itself
        else:
            consumer.assign([])
        self._listener.assigned({tp: starts.get(tp, StartPosition(None, False)) for tp in tps})

    @staticmethod
    def _explicit_offset(start: StartPosition | None) -> int:
        if start is None or start.committed or start.offset is None:
            return OFFSET_STORED
        return start.offset

    def _start_positions(self, partitions: list[Any]) -> dict[TopicPartition, StartPosition]:
        """Committed offsets; ``startFrom`` resolved to an offset for partitions without one.

        A partition without a committed offset starts at its log end (latest) or log start
        (earliest), and the engine commits that offset at its next commit even if no record
        arrives: otherwise a pipeline that starts at latest and restarts would skip what was
        produced while it was down.
        """
        try:
            found = self._c.committed(partitions, timeout=COMMITTED_TIMEOUT)
        except Exception as exc:
            log.warning("could not read committed offsets on assign (%s); using startFrom", exc)
            return {}
        starts: dict[TopicPartition, StartPosition] = {}
        for p in found:
            tp = TopicPartition(p.topic, p.partition)
            if p.offset >= 0:
                starts[tp] = StartPosition(int(p.offset), committed=True)
                self._probe.timestamp(tp, p.offset)  # warm it: lag in seconds needs it
                continue
            try:
                low, high = self._c.get_watermark_offsets(p, timeout=5.0, cached=False)  # type: ignore[misc]
            except Exception as exc:
                log.warning("no watermarks for %s (%s); librdkafka applies startFrom", tp, exc)
                continue
            latest = self._start_from == "latest" and tp.topic not in self._earliest
            offset = high if latest else low
            starts[tp] = StartPosition(int(offset), committed=False)
        return starts

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        assert self._listener is not None
        if not self._let_go_done:  # else: close()'s revoke of what _let_go revoked already
            self._listener.revoking({TopicPartition(p.topic, p.partition) for p in partitions})
        self._give_back(consumer, partitions)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        assert self._listener is not None
        self._listener.lost({TopicPartition(p.topic, p.partition) for p in partitions})
        self._give_back(consumer, partitions)

    def _give_back(self, consumer: Any, partitions: list[Any]) -> None:
        """Unassign from the callback itself, after the listener has drained and committed.

        When a callback does not (un)assign, confluent-kafka does it afterwards and first asks
        librdkafka for the rebalance protocol, holding the GIL. Inside close() that request
        can wait forever (librdkafka #4041: the group handler has already terminated), which
        froze a closing consumer's whole process; seen as a worker that never exited on
        SIGTERM during a rebalance, and as a hung test run. We know the protocol, so we never
        take that path.
        """
        if self.cooperative:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()

    def _on_commit(self, err: Any, partitions: list[Any]) -> None:
        if self._listener is None:
            return
        if err is not None:
            self._listener.committed(None, str(err))
            return
        self._listener.committed(
            {
                TopicPartition(p.topic, p.partition): int(p.offset)
                for p in partitions
                if getattr(p, "error", None) is None and p.offset >= 0
            },
            None,
        )

    def _on_client_error(self, err: Any) -> None:
        if getattr(err, "fatal", lambda: False)():
            self._fatal = self._fatal or f"fatal Kafka error: {err}"
        else:
            log_client_error(err)  # once: not again what librdkafka's own log line said

    def _native(self, partitions: Collection[TopicPartition]) -> list[Any]:
        return [self._clients.topic_partition(tp.topic, tp.partition) for tp in partitions]


def leave_group(consumer: ConsumerLike, timeout: float) -> bool:
    """Unsubscribe and consume until nothing is assigned, for at most ``timeout`` seconds;
    True once nothing is. What :meth:`KafkaSource.close` does before close() (#4041/#4884),
    for any consumer: the test bed's teardown uses it too. Raises what the client raises."""
    if not consumer.assignment():
        return True
    consumer.unsubscribe()
    deadline = time.monotonic() + timeout
    while consumer.assignment():
        if time.monotonic() >= deadline:
            return False
        consumer.consume(num_messages=100, timeout=_LEAVE_POLL)
    return True
