"""Routing (engine/routing.py): where each outcome goes, and the sink's reports as settlements."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from offtake.engine.parking import Parking
from offtake.engine.routing import Router
from offtake.engine.settlements import Settled, SettledMany, Settlements
from offtake.metrics import Metrics
from offtake.processing.base import Outcome
from offtake.records import Record, TopicPartition
from offtake.sinks.base import Sink, SinkBatch, SinkError

TP = TopicPartition("in", 0)


class Message:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def topic(self) -> str:
        return "in"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"\xff not even utf-8"

    def headers(self) -> list[tuple[str, bytes]]:
        return [("h", b"1")]

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)


class Policy:
    """The error policy's side: what reached it, and how."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Record, str]] = []

    def exhausted(
        self, record: Record, epoch: int, error: BaseException, attempts: int, stage: str
    ) -> None:
        self.calls.append(("exhausted", record, stage))

    def give_up(
        self, record: Record, epoch: int, error: BaseException, attempts: int, stage: str
    ) -> None:
        self.calls.append(("give_up", record, stage))


class RecordingSink(Sink):
    forwards = True

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[SinkBatch] = []

    def submit(self, batch: SinkBatch) -> None:
        self.batches.append(batch)

    def drain(self, partitions: Collection[TopicPartition] | None, timeout: float) -> bool:
        return True


def router(strict: bool = False) -> tuple[Router, RecordingSink, Policy, Settlements, Parking]:
    sink, policy, settlements, parking = RecordingSink(), Policy(), Settlements(), Parking()
    policy_any: Any = policy
    r = Router(sink, policy_any, settlements, Metrics("t"), parking, lambda: {TP: 1}, 2, strict)
    r.start()
    return r, sink, policy, settlements, parking


def rec(offset: int) -> Record:
    return Record("in", 0, offset, b"k", {"n": offset}, (), None, b"{}")


def test_outcomes_go_to_the_sink_as_one_batch_the_rest_where_they_belong() -> None:
    r, sink, policy, settlements, _ = router()
    todo = [(rec(o), 1, 1) for o in range(4)]
    outcomes = [
        Outcome(["a"]),
        Outcome([]),  # dropped by the processor
        Outcome([], ValueError("flaky")),  # retriable, attempts left
        Outcome([], ValueError("bad"), retriable=False),
    ]
    retry = r.route(todo, outcomes)
    assert [b.offsets for b in sink.batches] == [[0]]
    assert settlements.take_all() == [Settled(TP, 1, 1, "dropped")]
    assert [(rec.offset, epoch, attempt) for rec, epoch, attempt in retry] == [(2, 1, 2)]
    assert [(how, record.offset, stage) for how, record, stage in policy.calls] == [
        ("give_up", 3, "process")
    ]
    assert r.out == 1  # one item with the sink, not reported yet


def test_records_of_a_stale_assignment_go_nowhere() -> None:
    r, sink, policy, settlements, _ = router()
    r.route([(rec(0), 7, 1)], [Outcome(["a"])])  # epoch 7: not the current assignment (1)
    assert sink.batches == [] and policy.calls == [] and settlements.take_all() == []


def test_strict_ordering_holds_the_records_behind_a_retried_one() -> None:
    r, sink, _, _, parking = router(strict=True)
    retry = r.route(
        [(rec(0), 1, 1), (rec(1), 1, 1)], [Outcome([], ValueError("x")), Outcome(["b"])]
    )
    assert [record.offset for record, _, _ in retry] == [0]
    assert sink.batches == []  # record 1 waits behind record 0, with its result
    hold = parking.hold_of(TP, 1)
    assert hold is not None and [(r_.offset, o) for r_, _, _, o in hold.behind] == [
        (1, Outcome(["b"]))
    ]
    r.route([(rec(0), 1, 2)], [Outcome(["a"])])  # the retry succeeds: its partition may go on
    assert parking.take_settled() == [TP]


def test_a_forwarded_record_that_failed_reaches_the_error_policy_as_consumed() -> None:
    r, sink, policy, settlements, _ = router()
    forward = SinkBatch(TP, 1, [10, 11, 12], [], [Message(10), Message(11), Message(12)])
    r.submit(forward)
    assert sink.batches == [forward] and r.out == 3
    sink.settle(forward, {1: SinkError("too large")})
    assert r.out == 0
    assert settlements.take_all() == [SettledMany(TP, [10, 12], 1, "delivered")]
    [(how, record, stage)] = policy.calls
    assert (how, stage) == ("exhausted", "sink")
    # Not decoded again: the bytes as consumed, for a dead letter byte for byte the same.
    assert (record.tp, record.offset, record.key) == (TP, 11, b"k")
    assert record.value == record.raw_value == b"\xff not even utf-8"
    assert record.headers == (("h", b"1"),) and record.timestamp == 1_700_000_000_000


def test_a_poll_of_a_partition_goes_to_the_sink_as_one_batch_and_settles_once() -> None:
    """Settlement per Work: more records than one processor call (100) are still one batch."""
    r, sink, policy, settlements, _ = router()
    todo = [(rec(o), 1, 1) for o in range(250)]
    r.route(todo, [Outcome([o]) for o in range(250)])
    [batch] = sink.batches
    assert (batch.tp, batch.epoch, batch.offsets) == (TP, 1, list(range(250)))
    sink.settle(batch, {7: SinkError("refused")})
    assert r.out == 0
    assert settlements.take_all() == [
        SettledMany(TP, [o for o in range(250) if o != 7], 1, "delivered")
    ]
    assert [(how, record.offset, stage) for how, record, stage in policy.calls] == [
        ("exhausted", 7, "sink")
    ]


def test_records_of_several_partitions_go_to_the_sink_as_a_batch_per_partition() -> None:
    r, sink, _, settlements, _ = router()
    r.current = lambda: {TP: 1, TopicPartition("in", 1): 1}
    other = Record("in", 1, 5, b"k", {}, (), None, b"{}")
    r.route([(rec(0), 1, 2), (other, 1, 2), (rec(1), 1, 2)], [Outcome(["v"])] * 3)
    assert [(b.tp.partition, b.offsets) for b in sink.batches] == [(0, [0]), (1, [5]), (0, [1])]
    for b in sink.batches:
        sink.settle(b)
    assert r.out == 0 and len(settlements.take_all()) == 3
