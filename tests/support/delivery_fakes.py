"""Fakes of the Kafka client side and of the poll loop for the delivery modes
(engine/delivery/): tests/unit/test_delivery_modes.py and tests/contract/
test_delivery_contract.py. Queue mode needs none of the client fakes: its share source runs
on the memory broker's share groups, with a :class:`Clock` and the worker's :class:`Listener`
(also tests/unit/test_delivery_queue.py)."""

from __future__ import annotations

from typing import Any

from offtake.engine.offsets import OffsetTracker
from offtake.kafka.source import StartPosition
from offtake.records import TopicPartition
from offtake.sinks.base import SinkError
from offtake.sinks.kafka_transactional import TransactionFailed


class FakeSource:
    """A consumer's commits: acknowledges every commit at once, as a synchronous commit's
    callback does (``policy`` is the at-least-once policy the callback reaches)."""

    def __init__(self) -> None:
        self.commits: list[tuple[dict[TopicPartition, int], bool]] = []
        self.policy: Any = None

    def commit(self, positions: dict[TopicPartition, int], asynchronous: bool) -> None:
        self.commits.append((dict(positions), asynchronous))
        assert self.policy is not None
        self.policy.on_commit(positions, None)


class FakeLoop:
    """The poll loop a policy calls back. With a ``tracker``, a drain is over when nothing of
    the partitions is pending (nothing settles meanwhile: there is no processing thread);
    without one, ``drained`` says how every drain ends."""

    def __init__(self, drained: bool = True, tracker: OffsetTracker | None = None) -> None:
        self.drained = drained
        self.tracker = tracker
        self.drains: list[tuple[set[TopicPartition] | None, float]] = []
        self.abandoned: list[set[TopicPartition]] = []
        self.failures: list[tuple[int, str]] = []
        self.changes = 0

    def drain(self, partitions: set[TopicPartition] | None, deadline: float) -> bool:
        self.drains.append((partitions, deadline))
        if self.tracker is not None:
            return self.tracker.pending_in(partitions) == 0
        return self.drained

    def abandon(self, partitions: set[TopicPartition]) -> None:
        self.abandoned.append(partitions)

    def fail(self, code: int, reason: str) -> None:
        self.failures.append((code, reason))

    def assignment_changed(self) -> None:
        self.changes += 1


class Clock:
    """The share source's clock, moved by the test (``now``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Listener:
    """The worker's part: a partition the share source hears of is assigned in the tracker."""

    def __init__(self, tracker: OffsetTracker) -> None:
        self.tracker = tracker

    def assigned(self, starts: dict[TopicPartition, StartPosition]) -> None:
        for tp in starts:
            self.tracker.assign(tp)

    def revoking(self, partitions: set[TopicPartition]) -> None: ...
    def lost(self, partitions: set[TopicPartition]) -> None: ...
    def committed(self, offsets: Any, error: str | None) -> None: ...


class FakeTransactionalSink:
    commit_timeout = 1.0
    call_timeout = 1.0

    def __init__(
        self, refuse: str | None = None, fenced: bool = False, renewable: bool = True
    ) -> None:
        self.refuse = refuse
        self.fenced = fenced
        self.renewable = renewable
        self.in_transaction = True
        self.committed: list[dict[TopicPartition, int]] = []
        self.aborts = 0
        self.renewals = 0

    def renew(self) -> None:
        """A new producer epoch: what a fenced producer needs (see kafka_transactional)."""
        if not self.renewable:
            raise SinkError("the coordinator is unreachable (fake)")
        self.renewals += 1
        self.in_transaction = True

    def commit_transaction(self, offsets: dict[TopicPartition, int], metadata: Any) -> None:
        if self.refuse is not None:
            self.abort_transaction()
            raise TransactionFailed(self.refuse)
        self.committed.append(dict(offsets))

    def abort_transaction(self) -> None:
        self.aborts += 1
        self.in_transaction = not self.fenced


class FakeStage:
    def call(self, fn: Any, timeout: float) -> Any:
        return fn()  # the processing thread, here the caller's


class FakeConsumerSide:
    """What the transactional policy asks of the consumer: group metadata, seeks."""

    def __init__(self) -> None:
        self.seeks: list[tuple[TopicPartition, int]] = []

    def group_metadata(self) -> object:
        return object()

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))
