"""One broker behaviour suite, two brokers: the memory broker and Apache Kafka.

:class:`BrokerBed` is what a test of Kafka behaviour gets from the ``bed`` fixture
(tests/memory/conftest.py): a :class:`~offtake.kafka.protocols.ClientFactory` whose clients
talk to the broker under test, plus the admin steps a test needs (a fresh topic, a fresh group,
produce and read records, committed offsets, more partitions). The memory bed wraps a
:class:`~offtake.kafka.memory.MemoryBroker`; the Kafka bed wraps the test bed's session-wide
KRaft broker and confluent-kafka, with timeouts shortened so that groups settle in seconds.
Test bodies use only this interface, so the same body runs on both.

Waits are bounded (:data:`SETTLE_TIMEOUT`): on the memory broker they end at once; on Kafka
a group needs a join round trip or two.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import NewPartitions

from offtake.kafka.memory import MemoryBroker
from offtake.kafka.real import ConfluentClients
from offtake.kafka.source import leave_group
from offtake_testbed.kafka import KafkaBroker

COOP = "cooperative-sticky"
SETTLE_TIMEOUT = 30.0  # seconds; generous for a loaded 2-core machine, instant on memory

# Consumer settings for quick groups on the test broker (group.min.session.timeout.ms is 1s
# there). The memory broker reads the same keys, so tests see the same timeouts on both.
_FAST_GROUPS = {
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 500,
    # A new topic or partition is noticed within this (librdkafka's default is 5 minutes).
    "topic.metadata.refresh.interval.ms": 500,
}


class BrokerBed:
    """The broker under test, as the suite's test bodies see it."""

    kind: str
    #: The broker's client factory (a ClientFactory: consumer(config), producer(config)).
    clients: Any

    def __init__(self, label: str) -> None:
        self._label = label
        self._consumers: list[Any] = []
        self._producers: list[Any] = []
        self._share_consumers: list[Any] = []
        self._admin: Any = None

    # -- names ------------------------------------------------------------------------------
    def name(self, what: str) -> str:
        """A name no other test uses, so tests share one Kafka broker without interfering."""
        return f"{self._label[:60]}-{what}-{uuid.uuid4().hex[:8]}"

    def group(self) -> str:
        return self.name("g")

    def topic(self, partitions: int = 1) -> str:
        """A new topic with a unique name."""
        name = self.name("t")
        self.create_topic(name, partitions)
        return name

    def create_topic(self, name: str, partitions: int) -> None:
        raise NotImplementedError

    # -- clients ----------------------------------------------------------------------------
    def consumer(self, group: str, name: str = "c", strategy: str = COOP, **conf: Any) -> Any:
        """A consumer in ``group``: client.id ``name``, manual commits, from the earliest.

        ``conf`` adds or overrides settings; a None value removes one (librdkafka's default).
        """
        config: dict[str, Any] = {
            **_FAST_GROUPS,
            "group.id": group,
            "client.id": name,
            "partition.assignment.strategy": strategy,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **conf,
        }
        # None removes a setting, leaving librdkafka's default.
        config = {k: v for k, v in config.items() if v is not None}
        c = self._make_consumer(config)
        self._consumers.append(c)
        return c

    def share_consumer(self, group: str, name: str = "s", **conf: Any) -> Any:
        """A share consumer in share group ``group``, explicit acknowledgement."""
        config = {
            "group.id": group,
            "client.id": name,
            "share.acknowledgement.mode": "explicit",
            **conf,
        }
        c = self.clients.share_consumer(config)
        self._share_consumers.append(c)
        return c

    def configure_share_group(self, group: str, **settings: str) -> None:
        """Share-group settings by their Kafka names with _ for . (share_auto_offset_reset)."""
        named = {k.replace("_", "."): v for k, v in settings.items()}
        self.clients.configure_share_group({}, group, named)

    def producer(self, **conf: Any) -> Any:
        p = self._make_producer(dict(conf))
        self._producers.append(p)
        return p

    def produce(
        self,
        topic: str,
        value: str | bytes | None,
        key: str | bytes | None = None,
        partition: int = -1,
        headers: list[tuple[str, bytes]] | None = None,
        timestamp: int = 0,
    ) -> None:
        """Write one record and wait for its delivery report (raising its error)."""
        errors: list[Any] = []
        p = self._admin_producer()
        p.produce(
            topic,
            value=value,
            key=key,
            partition=partition,
            headers=headers,
            timestamp=timestamp,
            on_delivery=lambda err, _msg: errors.append(err),
        )
        assert p.flush(SETTLE_TIMEOUT) == 0, f"no delivery report for a record to {topic}"
        if errors[0] is not None:
            raise KafkaException(errors[0])

    def read(self, topic: str) -> list[Any]:
        """Every record of ``topic`` up to its log end, in no group (plain assignment)."""
        reader = self._make_consumer({"group.id": self.name("reader"), "enable.auto.commit": False})
        try:
            parts = sorted(reader.list_topics(topic, timeout=10).topics[topic].partitions)
            ends = {
                p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in parts
            }
            reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
            out: list[Any] = []
            deadline = time.monotonic() + SETTLE_TIMEOUT
            while len(out) < sum(ends.values()):
                assert time.monotonic() < deadline, f"could not read {topic} to its end"
                out.extend(m for m in reader.consume(1000, 0.1) if m.error() is None)
            return sorted(out, key=lambda m: (m.partition(), m.offset()))
        finally:
            reader.close()

    def committed(self, group: str, topic: str, partition: int) -> int | None:
        """The group's committed offset, None when it has none, asked as any client would."""
        probe = self._make_consumer({"group.id": group, "enable.auto.commit": False})
        try:
            (tp,) = probe.committed([TopicPartition(topic, partition)], timeout=10)
        finally:
            probe.close()
        return tp.offset if tp.offset >= 0 else None

    def set_committed(self, group: str, topic: str, partition: int, offset: int) -> None:
        """Commit for an empty group from outside it, as an admin rewinding a group would."""
        admin = self._make_consumer({"group.id": group, "enable.auto.commit": False})
        try:
            admin.commit(offsets=[TopicPartition(topic, partition, offset)], asynchronous=False)
        finally:
            admin.close()

    def create_partitions(self, topic: str, total: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Close what the test left open, so that its groups empty before the next test."""
        for c in self._consumers:
            # Already closed by the test, or closing with an error the test provoked (a member
            # expelled from its group fails its final commit). confluent-kafka may raise a bare
            # KafkaError, which is no BaseException: only a bare except catches it, and it
            # must not escape a fixture's teardown (pytest aborts the whole session on it).
            # close() can also block for a long time on a member the group expelled (seen in a
            # full run: teardown hung past the test timeout), so it gets a bounded wait; see
            # _close_quietly for the hang no wait can bound.
            closer = threading.Thread(target=_close_quietly, args=(c,), daemon=True)
            closer.start()
            closer.join(CLOSE_TIMEOUT)
        for s in self._share_consumers:
            try:  # noqa: SIM105 -- a bare KafkaError is no BaseException
                s.close()
            except:  # noqa: E722 -- closed by the test already
                pass
        for p in self._producers:
            p.flush(5)

    def _make_producer(self, config: dict[str, Any]) -> Any:
        return self.clients.producer(config)

    def _admin_producer(self) -> Any:
        """The producer of :meth:`produce`, made once."""
        if self._admin is None:
            self._admin = self.clients.producer({})
        return self._admin

    # -- per broker -------------------------------------------------------------------------
    def _make_consumer(self, config: dict[str, Any]) -> Any:
        raise NotImplementedError


class MemoryBed(BrokerBed):
    """The memory broker, configured like the test bed's Kafka (no auto-created topics)."""

    kind = "memory"

    def __init__(self, label: str) -> None:
        super().__init__(label)
        self.broker = MemoryBroker(auto_create_topics=False)
        self.clients = self.broker.clients()

    def create_topic(self, name: str, partitions: int) -> None:
        self.broker.create_topic(name, partitions)

    def create_partitions(self, topic: str, total: int) -> None:
        self.broker.create_partitions(topic, total)

    def _make_consumer(self, config: dict[str, Any]) -> Any:
        return self.clients.consumer(config)


class SelfAssigningConsumer(Consumer):
    """A confluent-kafka consumer whose rebalance callbacks always (un)assign themselves.

    When a callback leaves that to confluent-kafka, it first asks librdkafka for the
    rebalance protocol while holding the GIL; inside close() that request can wait forever
    (librdkafka #4041) and froze a whole test run in a fixture's teardown. Like the worker's
    KafkaSource, this does the (un)assign itself after the test's callback, unless the
    callback already did.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        strategy = str(config.get("partition.assignment.strategy", ""))
        self._cooperative = "cooperative" in strategy
        self._synced = False

    def subscribe(
        self,
        topics: list[str],
        on_assign: Callable[..., None] | None = None,
        on_revoke: Callable[..., None] | None = None,
        on_lost: Callable[..., None] | None = None,
    ) -> None:
        super().subscribe(
            topics,
            on_assign=self._syncing("on_assign", on_assign),
            on_revoke=self._syncing("on_revoke", on_revoke),
            # Without on_lost, confluent-kafka reports a lost assignment to on_revoke.
            on_lost=self._syncing("on_lost", on_lost or on_revoke),
        )

    def _syncing(self, kind: str, callback: Callable[..., None] | None) -> Callable[..., None]:
        def run(consumer: Any, partitions: list[Any]) -> None:
            self._synced = False
            try:
                if callback is not None:
                    callback(consumer, partitions)
            finally:
                if not self._synced:
                    if kind == "on_assign":
                        (self.incremental_assign if self._cooperative else self.assign)(partitions)
                    elif self._cooperative:
                        self.incremental_unassign(partitions)
                    else:
                        self.unassign()

        return run

    def assign(self, partitions: list[Any]) -> None:
        self._synced = True
        super().assign(partitions)

    def unassign(self) -> None:
        self._synced = True
        super().unassign()

    def incremental_assign(self, partitions: list[Any]) -> None:
        self._synced = True
        super().incremental_assign(partitions)

    def incremental_unassign(self, partitions: list[Any]) -> None:
        self._synced = True
        super().incremental_unassign(partitions)


class KafkaClients:
    """confluent-kafka clients of the test bed's broker: a ClientFactory like ConfluentClients."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def consumer(self, config: dict[str, Any]) -> Any:
        return Consumer({"bootstrap.servers": self.bootstrap, **config})

    def producer(self, config: dict[str, Any]) -> Any:
        return Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0, **config})

    def share_consumer(self, config: dict[str, Any]) -> Any:
        return ConfluentClients().share_consumer({"bootstrap.servers": self.bootstrap, **config})

    def configure_share_group(
        self, config: dict[str, Any], group: str, settings: dict[str, str]
    ) -> int | None:
        return ConfluentClients().configure_share_group(
            {"bootstrap.servers": self.bootstrap, **config}, group, settings
        )

    def topic_partition(self, topic: str, partition: int, offset: int = -1001) -> Any:
        return TopicPartition(topic, partition, offset)


class KafkaBed(BrokerBed):
    """Apache Kafka: the test bed's session-wide single-node KRaft broker."""

    kind = "kafka"

    def __init__(self, label: str, broker: KafkaBroker) -> None:
        super().__init__(label)
        self.kafka = broker
        self.clients = KafkaClients(broker.bootstrap)

    def create_topic(self, name: str, partitions: int) -> None:
        self.kafka.create_topic(name, partitions)

    def create_partitions(self, topic: str, total: int) -> None:
        futures = self.kafka.admin().create_partitions([NewPartitions(topic, total)])
        futures[topic].result(timeout=SETTLE_TIMEOUT)

    def _make_consumer(self, config: dict[str, Any]) -> Any:
        return SelfAssigningConsumer({"bootstrap.servers": self.kafka.bootstrap, **config})


# -- helpers for test bodies ------------------------------------------------------------------


def poll_until(
    condition: Callable[[], bool],
    *consumers: Any,
    into: list[Any] | None = None,
    timeout: float = SETTLE_TIMEOUT,
    what: str = "the group to settle",
) -> list[Any]:
    """Poll every consumer until ``condition()`` holds; return what they got.

    What consume() returns is added to ``into`` as it arrives, so that the condition can
    look at it.
    """
    got: list[Any] = [] if into is None else into
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for c in consumers:
            got.extend(c.consume(100, 0.05))
    return got


def drain(*consumers: Any, rounds: int = 5, wait: float = 0.1) -> list[Any]:
    """A few more polls of every consumer: trailing callbacks of a rebalance, late records."""
    got: list[Any] = []
    for _ in range(rounds):
        for c in consumers:
            got.extend(c.consume(100, wait))
    return got


def owned(c: Any) -> list[int]:
    return sorted(tp.partition for tp in c.assignment())


def sizes(*consumers: Any) -> list[int]:
    return [len(c.assignment()) for c in consumers]


def records(messages: list[Any]) -> list[Any]:
    """The records among what consume() returned (no error events)."""
    return [m for m in messages if m.error() is None]


def codes(messages: list[Any]) -> list[int]:
    """The error codes among what consume() returned."""
    return [m.error().code() for m in messages if m.error() is not None]


Log = list[tuple[str, str, list[int]]]


class Recorder:
    """Rebalance callbacks that log (consumer name, kind, partitions) in a shared list."""

    def __init__(self, log: Log, name: str) -> None:
        self.log, self.name = log, name
        self.threads: set[str] = set()

    def cb(self, kind: str) -> Callable[[Any, list[Any]], None]:
        def callback(consumer: Any, parts: list[Any]) -> None:
            self.threads.add(threading.current_thread().name)
            self.log.append((self.name, kind, sorted(p.partition for p in parts)))

        return callback


def join(c: Any, log: Log, name: str, topic: str) -> Recorder:
    r = Recorder(log, name)
    c.subscribe([topic], on_assign=r.cb("assign"), on_revoke=r.cb("revoke"), on_lost=r.cb("lost"))
    return r


def error_code(exc: KafkaException) -> int:
    err: KafkaError = exc.args[0]
    return err.code()


__all__ = [
    "COOP",
    "SETTLE_TIMEOUT",
    "BrokerBed",
    "KafkaBed",
    "Log",
    "MemoryBed",
    "Recorder",
    "codes",
    "drain",
    "error_code",
    "join",
    "owned",
    "poll_until",
    "records",
    "sizes",
]


CLOSE_TIMEOUT = 10.0
# How long a consumer left open by a test may take to give up its partitions before close().
LEAVE_TIMEOUT = 5.0


def _close_quietly(consumer: Any) -> None:
    """Leave the group outside close(), then close.

    A rebalance callback that close() triggers (un)assigns from inside close(), and librdkafka
    can then wait forever (#4041, #4884) while the callback holds the GIL: the whole test run
    froze in this teardown, the main thread in a join whose timeout could never fire. The
    workaround librdkafka's maintainers give (#4527): unsubscribe, poll until nothing is
    assigned (the callback runs inside consume(), where it cannot hang), then close; the
    worker's own :func:`offtake.kafka.source.leave_group` does the first two.
    """
    try:  # noqa: SIM105 -- suppress() cannot catch a non-BaseException (a bare KafkaError)
        leave_group(consumer, LEAVE_TIMEOUT)
    except:  # noqa: E722 -- closed by the test already, or expelled: close() below decides
        pass
    try:  # noqa: SIM105 -- suppress() cannot catch a non-BaseException
        consumer.close()
    except:  # noqa: E722
        pass
