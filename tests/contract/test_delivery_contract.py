"""The delivery mode contract (offtake/engine/delivery/base.py), run on every delivery mode.

As the sink contract (test_sink_contract.py) runs over every sink, these test bodies run over
the three modes :func:`offtake.engine.assembly.make_delivery` chooses from: at-least-once,
transactional (exactly-once) and queue. Each runs with its own objects (the committers, the
offset tracker, the share source on the memory broker's share groups); only the Kafka client
side of the two offset modes is a fake (tests/support/delivery_fakes.py), as in
tests/unit/test_delivery_modes.py, which keeps what one mode alone does.

The shared rules: a settled record becomes durable (committed, or acknowledged to the share
group) exactly at the mode's moment, never before; nothing durable passes a record that is not
settled; once partitions are lost (or, in queue mode, a poll's records were given back) a late
settlement of theirs is stale; shutdown leaves every record durable or given back.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import pytest
from support.delivery_fakes import (
    Clock,
    FakeConsumerSide,
    FakeLoop,
    FakeSource,
    FakeStage,
    FakeTransactionalSink,
    Listener,
)

from offtake.engine.commits import Committer
from offtake.engine.delivery.at_least_once import AtLeastOnce
from offtake.engine.delivery.base import DeliveryMode
from offtake.engine.delivery.queue import Queue
from offtake.engine.delivery.transactional import Transactional, TransactionCommitter
from offtake.engine.offsets import OffsetTracker
from offtake.engine.settlements import Settled, SettledMany
from offtake.kafka.memory import MemoryBroker
from offtake.kafka.share_source import ShareSource, group_settings
from offtake.metrics import Metrics
from offtake.records import TopicPartition

TP = TopicPartition("in", 0)
RECORDS = 5  # offsets 0..4 of TP, consumed in one poll


class Mode(ABC):
    """One delivery mode, its records of ``TP`` consumed, and a view of what is durable."""

    policy: DeliveryMode
    loop: FakeLoop

    @property
    def tracker(self) -> OffsetTracker:
        return self.policy.tracker

    @property
    def epoch(self) -> int:
        epoch = self.tracker.epoch(TP)
        assert epoch is not None
        return epoch

    @abstractmethod
    def durable(self) -> set[int]:
        """Offsets of TP committed (below the acknowledged position) or acknowledged."""

    @abstractmethod
    def given_back(self) -> set[int]:
        """Offsets of TP the next consumer gets again (at or past the committed position, or
        released to the share group)."""

    @abstractmethod
    def lose(self) -> None:
        """Lose TP the mode's way, as the poll loop does it."""

    def moment(self) -> None:
        """The mode's moment to make settled records durable: the loop's step, when due."""
        self.policy.step(time.monotonic())

    def shut_down(self, drained: bool) -> None:
        """The loop's shutdown: end(), then final_commit() once processing stopped."""
        self.policy.end(drained)
        self.policy.final_commit(time.monotonic() + 1.0)


class OffsetMode(Mode):
    def committed_position(self) -> int | None:
        raise NotImplementedError

    def durable(self) -> set[int]:
        position = self.committed_position()
        return set(range(position)) if position is not None else set()

    def given_back(self) -> set[int]:
        position = self.committed_position() or 0
        return set(range(position, RECORDS))

    def lose(self) -> None:
        # Worker.lost: abandon, release from the tracker, then tell the policy.
        self.loop.abandon({TP})
        self.tracker.release(TP)
        self.loop.assignment_changed()
        self.policy.lost({TP})

    def consume(self) -> None:
        self.tracker.assign(TP)
        self.tracker.register_batch(TP, list(range(RECORDS)), 100, None)


class AtLeastOnceMode(OffsetMode):
    def __init__(self) -> None:
        self.source = FakeSource()
        source: Any = self.source
        tracker = OffsetTracker()
        self.loop = FakeLoop(tracker=tracker)
        self.policy = AtLeastOnce(Committer(source, tracker, Metrics("t"), 0.0, 1_000))
        self.source.policy = self.policy
        self.policy.bind(self.loop)
        self.consume()

    def committed_position(self) -> int | None:
        return self.tracker.last_committed(TP)


class TransactionalMode(OffsetMode):
    def __init__(self) -> None:
        self.sink = FakeTransactionalSink()
        self.source = FakeConsumerSide()
        tracker = OffsetTracker()
        self.loop = FakeLoop(tracker=tracker)
        fakes: tuple[Any, Any, Any] = (self.source, FakeStage(), self.sink)
        committer = TransactionCommitter(
            fakes[0], tracker, Metrics("t"), 0.0, 1_000, fakes[1], fakes[2]
        )
        self.policy = Transactional(committer, fakes[0], drain_timeout=1.0)
        self.policy.bind(self.loop)
        self.consume()

    def committed_position(self) -> int | None:
        positions = [c[TP] for c in self.sink.committed if TP in c]
        return max(positions) if positions else None


class QueueMode(Mode):
    def __init__(self) -> None:
        self.broker = MemoryBroker()
        self.broker.create_topic(TP.topic, 1)
        for i in range(RECORDS):
            self.broker.produce(TP.topic, {"id": i})
        self.clock = Clock()
        self.source = ShareSource(
            self.broker.clients(),
            {"group.id": "g"},
            [TP.topic],
            group_settings("earliest", 3),
            self.clock,
        )
        tracker = OffsetTracker()
        self.loop = FakeLoop(tracker=tracker)
        self.policy = Queue(tracker, self.source, Metrics("t"))
        self.policy.bind(self.loop)
        self.source.open(Listener(tracker))
        got = self.source.consume(500, 1.0)
        assert len(got) == RECORDS
        tracker.register_batch(TP, [m.offset() or 0 for m in got], 100, None)

    def _states(self) -> dict[int, str]:
        return {
            offset: state
            for (_, offset), (state, _) in self.broker.share_states("g", TP.topic).items()
        }

    def durable(self) -> set[int]:
        return {o for o, s in self._states().items() if s in ("acknowledged", "archived")}

    def given_back(self) -> set[int]:
        return {o for o, s in self._states().items() if s == "available"}

    def lose(self) -> None:
        # A poll's lock about to run out: its records go back to the group (Queue.step).
        self.clock.now += self.source.lock_seconds - 1
        self.policy.step(time.monotonic())


MODES = {"at-least-once": AtLeastOnceMode, "transactional": TransactionalMode, "queue": QueueMode}


@pytest.fixture(params=list(MODES))
def mode(request: pytest.FixtureRequest) -> Iterator[Mode]:
    yield MODES[request.param]()


def test_settlements_count_their_records_and_stale_or_failed_ones_nothing(mode: Mode) -> None:
    epoch = mode.epoch
    assert mode.policy.settle(SettledMany(TP, [0, 1], epoch, "delivered")) == 2
    assert mode.policy.settle(Settled(TP, 2, epoch, "dropped")) == 1
    assert mode.policy.settle(SettledMany(TP, [3], epoch + 99, "delivered")) == 0  # stale
    assert mode.policy.settle(Settled(TP, 4, epoch, "failed", "boom")) == 0  # the loop stops
    assert mode.tracker.pending_in({TP}) == 1  # only the stale one is still pending


def test_a_settled_record_is_durable_at_the_modes_moment_and_not_before(mode: Mode) -> None:
    mode.policy.settle(SettledMany(TP, list(range(RECORDS)), mode.epoch, "delivered"))
    assert mode.durable() == set()  # settled is not yet durable
    mode.moment()
    assert mode.durable() == set(range(RECORDS))
    assert mode.tracker.inflight_messages == 0  # durable: no longer in flight
    assert mode.loop.failures == []


def test_nothing_durable_passes_an_unsettled_record(mode: Mode) -> None:
    epoch = mode.epoch
    mode.policy.settle(SettledMany(TP, [0, 1], epoch, "delivered"))
    mode.policy.settle(SettledMany(TP, [3, 4], epoch, "delivered"))  # 2 still pending
    mode.moment()
    durable = mode.durable()
    assert 2 not in durable and durable <= {0, 1, 3, 4}
    # Not forgotten either: still pending here, or to be consumed again (exactly-once
    # aborted the transaction that could not drain, and rewound).
    assert mode.tracker.pending_in({TP}) == 1 or 2 in mode.given_back()


def test_late_settlements_after_losing_partitions_are_stale(mode: Mode) -> None:
    old = mode.epoch
    mode.policy.settle(Settled(TP, 0, old, "delivered"))
    mode.lose()
    assert {TP} in mode.loop.abandoned and mode.loop.changes >= 1
    assert mode.tracker.epoch(TP) != old  # the old assignment is over
    assert mode.policy.settle(SettledMany(TP, [1, 2, 3, 4], old, "delivered")) == 0
    mode.moment()
    assert mode.durable() & {1, 2, 3, 4} == set()  # nothing of the late settlement
    assert mode.loop.failures == []  # losing partitions stops no mode: it goes on


def test_a_graceful_shutdown_makes_every_settled_record_durable(mode: Mode) -> None:
    mode.policy.settle(SettledMany(TP, list(range(RECORDS)), mode.epoch, "delivered"))
    mode.shut_down(drained=True)
    assert mode.durable() == set(range(RECORDS))


def test_shutdown_leaves_every_record_durable_or_given_back(mode: Mode) -> None:
    mode.policy.settle(SettledMany(TP, [0, 1, 2], mode.epoch, "delivered"))
    mode.shut_down(drained=False)  # 3 and 4 never settled: the drain budget ran out
    durable, given_back = mode.durable(), mode.given_back()
    assert durable & given_back == set()
    assert durable | given_back == set(range(RECORDS))
    assert {3, 4} <= given_back
