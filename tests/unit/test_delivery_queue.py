"""The Queue delivery mode (queue mode) with the share source on the memory broker's share
groups, against a fake loop: what each hook acknowledges, releases and exports."""

from __future__ import annotations

from typing import Any

from support.delivery_fakes import Clock, Listener

from offtake.engine.delivery.queue import Queue, until_settled
from offtake.engine.offsets import OffsetTracker
from offtake.engine.settlements import Settled, SettledMany
from offtake.kafka.memory import MemoryBroker
from offtake.kafka.memory.messages import MemoryMessage
from offtake.kafka.share_source import Ack, ShareSource, group_settings
from offtake.metrics import Metrics
from offtake.records import TopicPartition

TP = TopicPartition("jobs", 0)


class FakeLoop:
    def __init__(self) -> None:
        self.abandoned: list[set[TopicPartition]] = []
        self.changes = 0

    def drain(self, partitions: set[TopicPartition] | None, deadline: float) -> bool:
        return True

    def abandon(self, partitions: set[TopicPartition]) -> None:
        self.abandoned.append(partitions)

    def fail(self, code: int, reason: str) -> None:
        raise AssertionError(reason)

    def assignment_changed(self) -> None:
        self.changes += 1


def queue(n: int = 5) -> tuple[Queue, ShareSource, MemoryBroker, FakeLoop, Clock, list[Any]]:
    broker = MemoryBroker()
    broker.create_topic("jobs", 1)
    for i in range(n):
        broker.produce("jobs", {"id": i})
    clock = Clock()
    source = ShareSource(
        broker.clients(), {"group.id": "g"}, ["jobs"], group_settings("earliest", 3), clock
    )
    tracker = OffsetTracker()
    policy = Queue(tracker, source, Metrics("t"))
    loop = FakeLoop()
    policy.bind(loop)
    source.open(Listener(tracker))
    got = source.consume(500, 1.0)
    assert len(got) == n
    tracker.register_batch(TP, [m.offset() for m in got], 100, None)
    return policy, source, broker, loop, clock, got


def states(broker: MemoryBroker) -> dict[int, tuple[str, int]]:
    return {offset: state for (_, offset), state in broker.share_states("g", "jobs").items()}


def test_settled_records_are_accepted_and_the_poll_leaves_the_tracker() -> None:
    policy, source, broker, _, _, _ = queue()
    epoch = policy.tracker.epoch(TP)
    assert epoch is not None
    assert policy.settle(SettledMany(TP, [0, 1, 2], epoch, "delivered")) == 3
    assert policy.settle(Settled(TP, 3, epoch, "dlq")) == 1
    assert source.acquired == 1 and policy.tracker.inflight_messages == 5
    assert policy.settle(Settled(TP, 4, epoch, "dropped")) == 1
    assert source.acquired == 0 and policy.tracker.inflight_messages == 0  # may poll again
    policy.step(0.0)  # sends the acknowledgements
    assert {s for s, _ in states(broker).values()} == {"acknowledged"}
    accepted = policy.metrics.share_acknowledged.labels("accept")._value.get()
    assert accepted == 5


def test_a_record_skipped_by_policy_is_rejected_the_brokers_dead_end() -> None:
    """errors.policy: skip gave up on it and nothing kept it: archived, never delivered again."""
    policy, _, broker, _, _, _ = queue(2)
    epoch = policy.tracker.epoch(TP)
    assert epoch is not None
    policy.settle(Settled(TP, 0, epoch, "skipped"))
    policy.settle(Settled(TP, 1, epoch, "delivered"))
    policy.step(0.0)
    assert states(broker) == {0: ("archived", 1), 1: ("acknowledged", 1)}
    assert policy.metrics.share_acknowledged.labels("reject")._value.get() == 1
    assert policy.metrics.share_acknowledged.labels("accept")._value.get() == 1


def test_a_failed_record_is_released_for_the_next_worker() -> None:
    policy, _, broker, _, _, _ = queue(1)
    epoch = policy.tracker.epoch(TP)
    assert epoch is not None
    assert policy.settle(Settled(TP, 0, epoch, "failed", "boom")) == 0  # the loop stops
    policy.step(0.0)
    assert states(broker)[0] == ("available", 1)


def test_a_poll_about_to_outlive_its_lock_is_released_and_its_work_abandoned() -> None:
    policy, source, broker, loop, clock, _ = queue(3)
    before = policy.tracker.epoch(TP)
    clock.now += source.lock_seconds - 1  # inside the release margin, before the lock ends
    policy.step(0.0)
    assert loop.abandoned == [{TP}] and loop.changes == 1
    assert policy.tracker.epoch(TP) != before  # a late settlement of theirs is stale
    assert policy.metrics.share_lock_expired.labels("released")._value.get() == 3
    assert {s for s, _ in states(broker).values()} == {"available"}
    assert source.acquired == 0  # the next poll may come


def test_final_commit_releases_what_was_not_delivered() -> None:
    policy, _, broker, _, _, _ = queue(4)
    epoch = policy.tracker.epoch(TP)
    assert epoch is not None
    policy.settle(SettledMany(TP, [0, 1], epoch, "delivered"))
    policy.final_commit(deadline=1e12)
    assert {o: s for o, (s, _) in states(broker).items()} == {
        0: "acknowledged",
        1: "acknowledged",
        2: "available",
        3: "available",
    }
    assert policy.metrics.share_acknowledged.labels("release")._value.get() == 2


def test_lag_is_exported_in_seconds_only() -> None:
    """The age of the poll's records when acquired; no lag in messages (a share group commits
    no offsets to count them from) rather than a wrong 0."""
    policy, _, _, _, _, _ = queue(2)
    policy.step(0.0)
    assert policy.metrics.lag_seconds.labels("jobs", "0")._value.get() >= 0.0
    assert ("jobs", "0") in policy.metrics.lag_seconds._metrics
    assert policy.metrics.lag_messages._metrics == {}


def test_a_late_settlement_does_not_acknowledge_the_record_acquired_again() -> None:
    """A poll given back before its lock ran out is acquired again (here, by this worker);
    the first processing's late settlement is stale and leaves the new acquisition alone."""
    policy, source, broker, _, clock, _ = queue(2)
    old = policy.tracker.epoch(TP)
    assert old is not None
    clock.now += source.lock_seconds - 1
    policy.step(0.0)  # given back
    again = source.consume(500, 1.0)
    assert [m.offset() for m in again] == [0, 1]
    assert policy.settle(SettledMany(TP, [0, 1], old, "delivered")) == 0
    policy.step(0.0)
    assert {o: s for o, (s, _) in states(broker).items()} == {0: "acquired", 1: "acquired"}
    assert source.acquired == 2  # still held for the new epoch's settlements


class Reversed:
    """A share consumer whose polls come back in reverse: partitions interleaved, offsets
    descending (librdkafka keeps a partition's records together; nothing promises it)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def poll(self, timeout: float) -> list[Any]:
        return list(reversed(self.inner.poll(timeout)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_poll_is_handed_on_per_partition_in_offset_order_and_acknowledged_per_partition() -> None:
    broker = MemoryBroker()
    broker.create_topic("jobs", 2)
    for i in range(6):
        broker.produce("jobs", {"id": i}, partition=i % 2)
    clients = broker.clients()
    make = clients.share_consumer
    clients.share_consumer = lambda config: Reversed(make(config))  # type: ignore[method-assign,assignment,return-value]
    source = ShareSource(clients, {"group.id": "g"}, ["jobs"], group_settings("earliest", 3))
    tracker = OffsetTracker()
    source.open(Listener(tracker))
    got = source.consume(500, 1.0)
    assert [(m.partition(), m.offset()) for m in got] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 1),
        (1, 2),
    ]
    assert source.frontier == {TP: 2, TopicPartition("jobs", 1): 2}
    assert source.acquired == 6
    assert source.acknowledge_many(TP, [0, 1, 7], Ack.ACCEPT) == 2  # 7 was never held
    assert source.acknowledge_many(TP, [1], Ack.ACCEPT) == 0  # acknowledged already
    assert source.acquired == 4
    assert source.release_all() == 4
    assert source.acquired == 0 and source.stats.acknowledged[Ack.RELEASE] == 4
    source.flush()
    states = {where: state for where, (state, _) in broker.share_states("g", "jobs").items()}
    assert states[(0, 0)] == "acknowledged" and states[(1, 2)] == "available"


def test_only_a_work_of_first_deliveries_skips_numbering_its_attempts() -> None:
    """Queue mode numbers attempts from the delivery count; a Work whose records were all
    delivered once starts each at 1, and the stage takes its fast path for it."""
    policy, _, _, _, _, got = queue(3)
    fresh = policy.all_first_attempts
    assert fresh(got)
    again = MemoryMessage("jobs", 0, 9, None, b"", None, 0, delivery_count=2)
    assert not fresh([*got, again])
    assert fresh([MemoryMessage("jobs", 0, 9, None, b"", None, 0)])  # no count: attempt 1


def test_the_wait_while_a_poll_is_out_ends_on_settlements_not_after_a_sleep() -> None:
    waits: list[tuple[float, int]] = []
    pending = [False]
    wait = until_settled(lambda: 7, lambda t, mark: waits.append((t, mark)), lambda: pending[0])
    wait(0.005)
    assert waits == [(0.005, 7)]  # waits for progress past the mark taken before looking
    pending[0] = True
    wait(0.005)
    assert waits == [(0.005, 7)]  # settlements already wait to be taken: no wait at all
