"""The scheduler alone (engine/scheduler.py): lanes, the ready queue, the in-flight limit."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from offtake.engine.parking import Attempt
from offtake.engine.scheduler import Order, Scheduler
from offtake.records import Record, TopicPartition, make_record


def rec(offset: int, key: bytes | None, partition: int = 0) -> Attempt:
    record = make_record("t", partition, offset, key, None, (), None, None)
    return (record, 1, 1)


def offsets(items: list[Attempt]) -> list[int]:
    return [r.offset for r, _, _ in items]


def test_key_order_one_record_of_a_key_at_a_time_others_flow_past() -> None:
    s = Scheduler("key", 10)
    for i, key in enumerate([b"a", b"a", b"b", b"a", b"c"]):
        s.add(rec(i, key))
    assert s.waiting == 2
    first = s.take(10)
    assert offsets(first) == [0, 2, 4]  # one per key; 1 and 3 wait behind 0
    assert s.take(10) == []
    s.returned(3)
    s.done(first[0])
    assert offsets(s.take(10)) == [1]  # the next of key a, in offset order
    assert s.waiting == 1


def test_a_null_key_is_one_key_per_partition() -> None:
    s = Scheduler("key", 10)
    s.add(rec(0, None, partition=0))
    s.add(rec(1, None, partition=0))
    s.add(rec(0, None, partition=1))
    assert [(r.partition, r.offset) for r, _, _ in s.take(10)] == [(0, 0), (1, 0)]


def test_partition_order_and_no_order() -> None:
    s = Scheduler("partition", 10)
    for i, key in enumerate([b"a", b"b", b"c"]):
        s.add(rec(i, key))
    s.add(rec(0, b"a", partition=1))
    assert [(r.partition, r.offset) for r, _, _ in s.take(10)] == [(0, 0), (1, 0)]
    n = Scheduler("none", 10)
    for i in range(3):
        n.add(rec(i, b"a"))
    assert offsets(n.take(10)) == [0, 1, 2]
    assert n.lanes() == 0


def test_the_in_flight_limit() -> None:
    s = Scheduler("none", 2)
    for i in range(5):
        s.add(rec(i, None))
    assert offsets(s.take(10)) == [0, 1]
    assert s.take() == []
    s.returned(1)
    assert offsets(s.take(10)) == [2]


def test_a_parked_record_holds_its_lane_until_done_and_resumes_first() -> None:
    s = Scheduler("key", 10)
    s.add(rec(0, b"a"))
    s.add(rec(1, b"a"))
    s.add(rec(2, b"b"))
    head, other = s.take(10)
    s.returned(2)  # 0 failed and is parked (no done): key a stays held
    s.done(other)
    s.add(rec(3, b"b"))
    assert offsets(s.take(10)) == [3]  # key b flows past the parked record of key a
    s.returned(1)
    s.resume(head)
    assert offsets(s.take(10)) == [0]
    s.returned(1)
    s.done(head)
    assert offsets(s.take(10)) == [1]


def test_memory_follows_the_records_held_not_the_keys_seen() -> None:
    s = Scheduler("key", 100_000)
    for i in range(100_000):
        s.add(rec(i, str(i).encode()))
    items = s.take(100_000)
    s.returned(len(items))
    for item in items:
        s.done(item)
    assert s.lanes() == 0 and s.idle()


def test_forget_drops_a_revoked_partitions_lanes_and_ready_records() -> None:
    s = Scheduler("key", 1)
    s.add(rec(0, b"a", partition=0))
    s.add(rec(1, b"a", partition=0))
    s.add(rec(0, b"a", partition=1))
    started = s.take()
    s.forget([TopicPartition("t", 0)])
    assert s.waiting == 0
    s.returned(1)
    s.done(started[0])  # a stale call finishing: nothing to free
    assert [(r.partition, r.offset) for r, _, _ in s.take()] == [(1, 0)]


@settings(max_examples=200, deadline=None)
@given(
    order=st.sampled_from(["key", "partition", "none"]),
    limit=st.integers(1, 8),
    chunk=st.integers(1, 4),
    keys=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 4)), min_size=1, max_size=60),
    steps=st.lists(st.tuples(st.integers(0, 99), st.booleans()), max_size=200),
)
def test_random_runs_keep_the_lane_rules(
    order: Order,
    limit: int,
    chunk: int,
    keys: list[tuple[int, int]],
    steps: list[tuple[int, bool]],
) -> None:
    """Random adds, finishes and parks: no two records of a lane in flight, each lane's records
    start in offset order, the limit holds, and everything finishes with no lane left."""
    s = Scheduler(order, limit)
    next_offset: dict[int, int] = defaultdict(int)
    pending = list(keys)
    running: list[Attempt] = []
    parked: list[Attempt] = []
    started: dict[object, list[int]] = defaultdict(list)

    def lane(r: Record) -> object:
        return {"key": (r.partition, r.key), "partition": r.partition, "none": r.offset}[order]

    def start() -> None:
        for item in s.take(chunk):
            r = item[0]
            if order != "none":
                assert all(lane(o[0]) != lane(r) for o in running), "two records of a lane"
            assert len(running) < limit
            if item not in parked:
                started[lane(r)].append(r.offset)
            else:
                parked.remove(item)
            running.append(item)

    def step(pick: int, park: bool) -> None:
        if pending and pick % 3 == 0:
            partition, key = pending.pop(0)
            offset = next_offset[partition]
            next_offset[partition] += 1
            s.add(rec(offset, str(key).encode(), partition))
        elif running:
            item = running.pop(pick % len(running))
            s.returned(1)
            if park:
                parked.append(item)
                s.resume(item)  # due at once
            else:
                s.done(item)
        start()

    for pick, park in steps:
        step(pick, park)
    while pending or running or s.has_ready():
        step(0 if pending else 1, False)
    assert s.idle() and s.lanes() == 0 and s.waiting == 0
    if order != "none":
        for offsets_started in started.values():
            assert offsets_started == sorted(offsets_started)


def test_ten_keys_on_twelve_partitions_all_get_a_call() -> None:
    # The bench's 10 keys x 12 partitions shape (issue 37): records behind a busy key must not
    # keep the other keys' records from being handed out; every lane's head is ready at once.
    s = Scheduler("key", 64)
    keys = [b"k%d" % k for k in range(10)]
    for offset in range(200):
        for partition in range(12):
            s.add(rec(offset, keys[(offset + partition) % 10], partition))
    started = s.take(64)
    assert len(started) == 64  # 12 partitions x 10 keys = 120 lanes, capped at the limit
    assert len({(r.partition, r.key) for r, _, _ in started}) == 64  # one per lane
    single = Scheduler("key", 64)
    for offset in range(2000):
        single.add(rec(offset, keys[offset % 10]))
    assert {r.key for r, _, _ in single.take(64)} == set(keys)  # 10 in flight, one per key
