"""Parking (engine/parking.py): the retry heap and the partitions held behind a parked record."""

from __future__ import annotations

from offtake.engine.parking import Parking
from offtake.processing.base import Outcome
from offtake.records import Record, TopicPartition

TP = TopicPartition("in", 0)


def rec(offset: int, partition: int = 0) -> Record:
    return Record("in", partition, offset, None, b"v", (), 0, b"v")


def test_parked_records_come_back_once_due_earliest_first() -> None:
    parking = Parking()
    parking.park(rec(1), 1, 2, due=10.0)
    parking.park(rec(2), 1, 3, due=5.0)
    parking.park(rec(3), 1, 2, due=5.0)  # same due time: in the order parked
    assert parking.parked() == 3
    assert not parking.has_due(4.9)
    assert parking.until_next_due(4.0) == 1.0
    assert parking.take_due(4.9, limit=10) == []
    due = parking.take_due(5.0, limit=10)
    assert [(r.offset, epoch, attempt) for r, epoch, attempt in due] == [(2, 1, 3), (3, 1, 2)]
    assert parking.until_next_due(20.0) == 0.0
    assert [r.offset for r, _, _ in parking.take_due(20.0, limit=10)] == [1]
    assert parking.until_next_due(20.0) is None and parking.parked() == 0


def test_take_due_takes_at_most_the_limit() -> None:
    parking = Parking()
    for offset in range(5):
        parking.park(rec(offset), 1, 2, due=1.0)
    assert [r.offset for r, _, _ in parking.take_due(1.0, limit=3)] == [0, 1, 2]
    assert [r.offset for r, _, _ in parking.take_due(1.0, limit=3)] == [3, 4]


def test_records_held_behind_a_parked_one_come_back_in_order_once_it_settles() -> None:
    parking = Parking()
    assert not parking.holds
    parking.hold(TP, offset=7, epoch=1)
    hold = parking.hold_of(TP, 1)
    assert hold is not None and hold.offset == 7 and parking.holds
    done = Outcome(["x"])
    parking.hold_behind(hold, (rec(8), 1, 1, None))
    parking.hold_behind(hold, (rec(9), 1, 1, done))
    assert parking.hold_of(TopicPartition("in", 1), 1) is None  # other partitions: not held
    parking.settled(TP)
    assert parking.take_settled() == [TP] and parking.take_settled() == []
    behind = parking.release(TP)
    assert [(r.offset, o) for r, _, _, o in behind] == [(8, None), (9, done)]
    assert not parking.holds and parking.release(TP) == type(behind)()


def test_a_hold_of_an_earlier_assignment_is_dropped() -> None:
    parking = Parking()
    parking.hold(TP, offset=7, epoch=1)
    assert parking.hold_of(TP, 2) is None  # assigned again meanwhile: the old hold is stale
    assert not parking.holds


def test_released_records_wait_again_behind_a_record_that_holds_anew() -> None:
    parking = Parking()
    parking.hold(TP, offset=7, epoch=1)
    rest = parking.release(TP)
    rest.extend([(rec(9), 1, 1, None), (rec(10), 1, 1, None)])
    assert not parking.held_again(TP, rest)  # nothing holds: the caller goes on with them
    parking.hold(TP, offset=8, epoch=1)  # record 8, released, failed again
    assert parking.held_again(TP, rest)
    assert [r.offset for r, *_ in parking.release(TP)] == [9, 10]


def test_forgotten_partitions_are_held_no_more() -> None:
    parking = Parking()
    parking.hold(TP, offset=7, epoch=1)
    parking.hold(TopicPartition("in", 1), offset=3, epoch=1)
    parking.forget([TP])
    assert parking.hold_of(TP, 1) is None
    assert parking.hold_of(TopicPartition("in", 1), 1) is not None
