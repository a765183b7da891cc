"""Kafka's behaviour as the engine relies on it, on the memory broker and on Apache Kafka.

Every test here runs twice with the same body (the ``bed`` fixture, tests/memory/conftest.py):
once on the memory broker and once on the test bed's real Kafka broker through
confluent-kafka. A pipeline that passes on the memory broker has therefore been exercised
against behaviour this suite checked on Kafka. Where the two differ, the memory broker is
fixed; a difference that cannot be removed is written down in the test that shows it.

Test bodies wait with bounded polls (:func:`poll_until`) instead of fixed rounds: the memory
broker settles at once, a Kafka group needs a join round trip or two.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import IllegalStateException, KafkaError, KafkaException, TopicPartition
from support.brokers import (
    COOP,
    SETTLE_TIMEOUT,
    BrokerBed,
    Log,
    codes,
    drain,
    error_code,
    join,
    owned,
    poll_until,
    records,
    sizes,
)

# -- group membership and assignment ----------------------------------------------------------


@pytest.mark.parametrize("strategy", [COOP, "range", "roundrobin"])
def test_three_consumers_share_twelve_partitions(bed: BrokerBed, strategy: str) -> None:
    topic, group = bed.topic(12), bed.group()
    log: Log = []
    cs = [bed.consumer(group, f"c{i}", strategy) for i in range(3)]
    for i, c in enumerate(cs):
        join(c, log, f"c{i}", topic)
    poll_until(lambda: sizes(*cs) == [4, 4, 4], *cs)
    assert sorted(p for c in cs for p in owned(c)) == list(range(12))


def test_records_reach_exactly_one_member_in_partition_order(bed: BrokerBed) -> None:
    topic, group = bed.topic(12), bed.group()
    cs = [bed.consumer(group, f"c{i}") for i in range(3)]
    for c in cs:
        c.subscribe([topic])
    # The group settles first: records read by a member before a later join's rebalance are
    # read again by their next owner (nothing was committed), which is no fault of routing.
    poll_until(lambda: sizes(*cs) == [4, 4, 4], *cs)
    p = bed.producer()
    for i in range(240):
        p.produce(topic, value=str(i), key=str(i))
    assert p.flush(30) == 0
    got: list[Any] = []
    poll_until(lambda: len(got) >= 240, *cs, into=got, what="all 240 records")
    got += drain(*cs, rounds=2)
    partition_0 = [m.offset() for m in got if m.partition() == 0]
    assert partition_0 == sorted(partition_0)
    assert len(got) == 240
    assert len({(m.partition(), m.offset()) for m in got}) == 240


def test_cooperative_rebalance_moves_only_some_partitions(bed: BrokerBed) -> None:
    topic, group = bed.topic(12), bed.group()
    log: Log = []
    a, b = bed.consumer(group, "a"), bed.consumer(group, "b")
    join(a, log, "a", topic)
    join(b, log, "b", topic)
    poll_until(lambda: sizes(a, b) == [6, 6], a, b)
    drain(a, b)
    before = {"a": owned(a), "b": owned(b)}
    log.clear()
    c = bed.consumer(group, "c")
    join(c, log, "c", topic)
    poll_until(lambda: sizes(a, b, c) == [4, 4, 4], a, b, c)
    drain(a, b, c)
    after = {"a": owned(a), "b": owned(b), "c": owned(c)}
    # Each old member kept 4 of its partitions: only the 2 that moved were revoked...
    for name in ("a", "b"):
        assert set(after[name]) <= set(before[name])
        revoked = [p for n, kind, p in log if n == name and kind == "revoke"]
        assert revoked == [sorted(set(before[name]) - set(after[name]))]
    # ...the new member got exactly those, and on_revoke never ran with an empty list,
    # while on_assign runs once per rebalance even when empty (KIP-429, librdkafka).
    assert sorted(after["c"]) == sorted(
        set(before["a"]) - set(after["a"]) | set(before["b"]) - set(after["b"])
    )
    assert all(p for _, kind, p in log if kind == "revoke")
    assert ("a", "assign", []) in log and ("b", "assign", []) in log


def test_cooperative_new_owner_waits_for_the_old_owners_revoke(bed: BrokerBed) -> None:
    """A moved partition is assigned only after the old owner's on_revoke has returned."""
    topic, group = bed.topic(4), bed.group()
    timeline: list[tuple[float, str, list[int]]] = []
    a, b = bed.consumer(group, "a"), bed.consumer(group, "b")
    revoke_started = threading.Event()

    def slow_revoke(_c: Any, parts: list[Any]) -> None:
        revoke_started.set()
        time.sleep(0.5)  # e.g. draining in-flight work and committing
        timeline.append((time.monotonic(), "a-revoke-done", [p.partition for p in parts]))

    def b_assign(_c: Any, parts: list[Any]) -> None:
        timeline.append((time.monotonic(), "b-assign", sorted(p.partition for p in parts)))

    a.subscribe([topic], on_revoke=slow_revoke)
    poll_until(lambda: owned(a) == [0, 1, 2, 3], a)
    b.subscribe([topic], on_assign=b_assign)
    stop = threading.Event()

    def poll_a() -> None:
        while not stop.is_set():
            a.consume(10, 0.05)

    t = threading.Thread(target=poll_a)
    t.start()
    try:
        assert revoke_started.wait(30)
        # While a's on_revoke runs, b polls but is given nothing of a's: nobody owns twice.
        deadline = time.monotonic() + 30
        while (
            not any(e[1] == "b-assign" and e[2] for e in timeline) and time.monotonic() < deadline
        ):
            # Not owned(a) here: a consumer has one owner thread, and a's is busy revoking.
            b.consume(10, 0.05)
    finally:
        stop.set()
        t.join()
    done = next(e for e in timeline if e[1] == "a-revoke-done")
    given = next(e for e in timeline if e[1] == "b-assign" and e[2])
    assert sorted(done[2]) == given[2] and len(given[2]) == 2
    assert given[0] >= done[0]


def test_eager_rebalance_revokes_everything(bed: BrokerBed) -> None:
    topic, group = bed.topic(6), bed.group()
    log: Log = []
    a, b = bed.consumer(group, "a", "range"), bed.consumer(group, "b", "range")
    join(a, log, "a", topic)
    poll_until(lambda: owned(a) == list(range(6)), a)
    log.clear()
    join(b, log, "b", topic)
    poll_until(lambda: sizes(a, b) == [3, 3], a, b)
    assert ("a", "revoke", list(range(6))) in log
    assert log.index(("a", "revoke", list(range(6)))) < log.index(("b", "assign", [3, 4, 5]))
    assert ("a", "assign", [0, 1, 2]) in log  # the full new assignment, not an increment
    assert owned(a) == [0, 1, 2] and owned(b) == [3, 4, 5]


def test_assign_must_match_the_rebalance_protocol(bed: BrokerBed) -> None:
    topic = bed.topic(2)
    c = bed.consumer(bed.group())
    c.subscribe([topic])
    poll_until(lambda: sizes(c) == [2], c)
    with pytest.raises(KafkaException) as info:
        c.assign([TopicPartition(topic, 0)])
    assert error_code(info.value) == KafkaError._STATE
    e = bed.consumer(bed.group(), "e", "range")
    e.subscribe([topic])
    poll_until(lambda: sizes(e) == [2], e)
    with pytest.raises(KafkaException) as info:
        e.incremental_assign([TopicPartition(topic, 0)])
    assert error_code(info.value) == KafkaError._STATE


def test_mixed_protocols_in_one_group_are_refused(bed: BrokerBed) -> None:
    """The group's members have no assignor in common: the newcomer's join fails.

    librdkafka reports the broker's INCONSISTENT_GROUP_PROTOCOL as an error event from the
    newcomer's consume(), not from subscribe(), and the newcomer gets no partitions.
    """
    topic, group = bed.topic(2), bed.group()
    a = bed.consumer(group, "a")
    a.subscribe([topic])
    poll_until(lambda: sizes(a) == [2], a)
    b = bed.consumer(group, "b", "range")
    b.subscribe([topic])
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while KafkaError.INCONSISTENT_GROUP_PROTOCOL not in codes(got):
        assert time.monotonic() < deadline, f"no INCONSISTENT_GROUP_PROTOCOL error, got {got}"
        got.extend(b.consume(10, 0.1))
        a.consume(10, 0)
    assert sizes(a, b) == [2, 0]


def test_callbacks_run_inside_consume_on_the_calling_thread(bed: BrokerBed) -> None:
    topic = bed.topic(2)
    log: Log = []
    c = bed.consumer(bed.group())
    r = join(c, log, "c", topic)
    assert log == []  # subscribe() only joins; the assignment arrives in consume()

    def poll() -> None:
        poll_until(lambda: bool(log), c)

    t = threading.Thread(target=poll, name="poller")
    t.start()
    t.join()
    assert log == [("c", "assign", [0, 1])] and r.threads == {"poller"}


def test_close_revokes_on_self_then_others_take_over(bed: BrokerBed) -> None:
    topic, group = bed.topic(4), bed.group()
    log: Log = []
    a, b = bed.consumer(group, "a"), bed.consumer(group, "b")
    join(a, log, "a", topic)
    join(b, log, "b", topic)
    poll_until(lambda: sizes(a, b) == [2, 2], a, b)
    mine = owned(a)
    a.close()
    assert ("a", "revoke", mine) in log
    poll_until(lambda: owned(b) == [0, 1, 2, 3], b)
    with pytest.raises(RuntimeError):
        a.consume(1, 0)


def test_new_topic_partitions_rebalance_subscribers(bed: BrokerBed) -> None:
    topic = bed.topic(1)
    c = bed.consumer(bed.group())
    c.subscribe([topic])
    poll_until(lambda: owned(c) == [0], c)
    bed.create_partitions(topic, 3)
    poll_until(lambda: owned(c) == [0, 1, 2], c, what="the new partitions")
    # A regex subscription picks up a topic created after it.
    c2 = bed.consumer(bed.group(), "re")
    c2.subscribe([f"^{topic}.*"])
    poll_until(lambda: sizes(c2) == [3], c2)
    later = f"{topic}-later"
    bed.create_topic(later, 2)
    poll_until(lambda: sizes(c2) == [5], c2, what="the new topic")
    assert sorted((tp.topic, tp.partition) for tp in c2.assignment()) == [
        (topic, 0),
        (topic, 1),
        (topic, 2),
        (later, 0),
        (later, 1),
    ]


# -- offsets and commits ----------------------------------------------------------------------


def test_commit_and_committed(bed: BrokerBed) -> None:
    topic, group = bed.topic(2), bed.group()
    commits: list[tuple[Any, list[Any]]] = []
    c = bed.consumer(group, on_commit=lambda err, parts: commits.append((err, parts)))
    c.subscribe([topic])
    poll_until(lambda: sizes(c) == [2], c)
    result = c.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
    assert [(p.topic, p.partition, p.offset) for p in result] == [(topic, 0, 5)]
    assert commits == []  # like confluent-kafka, a synchronous commit does not call on_commit
    assert bed.committed(group, topic, 0) == 5
    assert bed.committed(group, topic, 1) is None
    assert [
        p.offset for p in c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)])
    ] == [5, -1001]
    assert c.commit(offsets=[TopicPartition(topic, 1, 7)]) is None  # asynchronous by default
    assert commits == []  # served by a later consume(), not from commit()
    poll_until(lambda: bool(commits), c, what="on_commit")
    err, parts = commits[0]
    assert err is None and [(p.partition, p.offset) for p in parts] == [(1, 7)]
    assert bed.committed(group, topic, 1) == 7


def test_commit_inside_on_revoke_is_where_the_new_owner_starts(bed: BrokerBed) -> None:
    topic, group = bed.topic(2), bed.group()
    for i in range(10):
        bed.produce(topic, str(i), partition=i % 2)
    a = bed.consumer(group, "a")
    revoked: list[int] = []

    def on_revoke(c: Any, parts: list[Any]) -> None:
        c.commit(
            offsets=[TopicPartition(p.topic, p.partition, 3) for p in parts], asynchronous=False
        )
        revoked.extend(p.partition for p in parts)

    a.subscribe([topic], on_revoke=on_revoke)
    read_by_a: list[Any] = []
    poll_until(lambda: len(records(read_by_a)) == 10, a, into=read_by_a)
    b = bed.consumer(group, "b")
    b.subscribe([topic])
    read_by_b: list[Any] = []
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while sizes(a, b) != [1, 1] or not read_by_b:
        assert time.monotonic() < deadline, "b was not given a partition"
        a.consume(10, 0.05)
        read_by_b.extend(b.consume(10, 0.05))
        assert len(read_by_b) < 10
    assert len(revoked) == 1 and owned(b) == revoked
    assert bed.committed(group, topic, revoked[0]) == 3
    # The new owner starts from the offset committed in on_revoke.
    assert [m.offset() for m in records(read_by_b)][:1] == [3]


def test_new_owner_starts_at_committed_offset_else_auto_offset_reset(bed: BrokerBed) -> None:
    topic, group = bed.topic(1), bed.group()
    for i in range(10):
        bed.produce(topic, str(i))
    bed.set_committed(group, topic, 0, 7)
    c = bed.consumer(group)
    c.subscribe([topic])
    got = poll_until(lambda: owned(c) == [0], c)
    got += drain(c)
    assert [m.offset() for m in records(got)] == [7, 8, 9]
    late = bed.consumer(bed.group(), "late", **{"auto.offset.reset": "latest"})
    late.subscribe([topic])
    got = poll_until(lambda: owned(late) == [0], late)
    assert records(got + drain(late)) == []
    bed.produce(topic, "10")
    got = []
    poll_until(lambda: bool(got), late, into=got)
    assert [m.offset() for m in records(got)] == [10]
    early = bed.consumer(bed.group(), "early")
    early.subscribe([topic])
    got = poll_until(lambda: owned(early) == [0], early)
    assert len(records(got + drain(early))) == 11


def test_auto_commit_commits_consumed_offsets(bed: BrokerBed) -> None:
    """enable.auto.commit and enable.auto.offset.store default to true, as in librdkafka."""
    topic, group = bed.topic(1), bed.group()
    for i in range(5):
        bed.produce(topic, str(i))
    c = bed.consumer(
        group,
        **{
            "enable.auto.commit": None,  # librdkafka's defaults: both true
            "enable.auto.offset.store": None,
            "auto.commit.interval.ms": 100,
        },
    )
    c.subscribe([topic])
    got: list[Any] = []
    poll_until(lambda: len(got) == 5, c, into=got, what="the records")

    def committed() -> bool:
        c.consume(10, 0.05)
        return bed.committed(group, topic, 0) == 5

    poll_until(committed, what="the automatic commit")


def test_position_is_unknown_until_a_record_is_returned(bed: BrokerBed) -> None:
    """position() is one past the last record returned, not where fetching will start."""
    topic, group = bed.topic(1), bed.group()
    for i in range(5):
        bed.produce(topic, str(i))
    bed.set_committed(group, topic, 0, 3)
    c = bed.consumer(group)

    def assign_paused(consumer: Any, parts: list[Any]) -> None:
        consumer.incremental_assign(parts)
        consumer.pause(parts)  # so that no record is returned yet

    c.subscribe([topic], on_assign=assign_paused)
    poll_until(lambda: owned(c) == [0], c)
    tp = TopicPartition(topic, 0)
    assert [p.offset for p in c.position([tp])] == [-1001]
    c.resume([tp])
    got = c.consume(1, 30)
    assert [m.offset() for m in got] == [3]
    assert [p.offset for p in c.position([tp])] == [4]
    c.seek(TopicPartition(topic, 0, 1))
    assert [p.offset for p in c.position([tp])] == [-1001]


# -- fetching ---------------------------------------------------------------------------------


def test_messages_look_like_confluent_messages(bed: BrokerBed) -> None:
    topic = bed.topic(1)
    stamp = int(time.time() * 1000) - 60_000
    bed.produce(topic, b"v", key="k", headers=[("h", b"1")], timestamp=stamp)
    c = bed.consumer(bed.group())
    c.subscribe([topic])
    got: list[Any] = []
    poll_until(lambda: bool(got), c, into=got)
    (m,) = got
    assert (m.error(), m.topic(), m.partition(), m.offset()) == (None, topic, 0, 0)
    assert (m.key(), m.value(), m.headers(), m.timestamp()) == (
        b"k",
        b"v",
        [("h", b"1")],
        (1, stamp),  # TIMESTAMP_CREATE_TIME
    )


def test_pause_stops_delivery_until_resume(bed: BrokerBed) -> None:
    topic = bed.topic(2)
    c = bed.consumer(bed.group())
    c.subscribe([topic])
    poll_until(lambda: sizes(c) == [2], c)
    c.pause([TopicPartition(topic, 0)])
    for i in range(6):
        bed.produce(topic, str(i), partition=i % 2)
    got: list[Any] = []
    poll_until(lambda: len(got) >= 3, c, into=got)
    got += drain(c)
    assert {m.partition() for m in got} == {1} and len(got) == 3
    c.resume([TopicPartition(topic, 0)])
    resumed: list[Any] = []
    poll_until(lambda: len(resumed) >= 3, c, into=resumed)
    assert [m.offset() for m in resumed] == [0, 1, 2]


def test_consume_waits_for_a_record_produced_meanwhile(bed: BrokerBed) -> None:
    topic = bed.topic(1)
    c = bed.consumer(bed.group())
    c.subscribe([topic])
    poll_until(lambda: sizes(c) == [1], c)
    drain(c, rounds=2)
    timer = threading.Timer(0.2, lambda: bed.produce(topic, "x"))
    timer.start()
    got = c.consume(10, 20.0)
    timer.join()
    assert [m.value() for m in got] == [b"x"]
    assert c.consume(10, 0.2) == []


def test_consume_returns_at_most_num_messages(bed: BrokerBed) -> None:
    topic = bed.topic(1)
    for i in range(7):
        bed.produce(topic, str(i))
    c = bed.consumer(bed.group())
    c.subscribe([topic])
    got: list[Any] = []
    while len(got) < 7:
        batch = c.consume(3, 0.5)
        assert len(batch) <= 3
        got.extend(batch)
        assert len(got) <= 7
    assert [m.offset() for m in got] == list(range(7))
    assert c.consume(0, 0) == []


def test_watermarks(bed: BrokerBed) -> None:
    topic = bed.topic(3)
    for i in range(7):
        bed.produce(topic, str(i), partition=i % 3)
    c = bed.consumer(bed.group())
    assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 3)
    assert c.get_watermark_offsets(TopicPartition(topic, 2), timeout=10) == (0, 2)
    # cached=True answers from what the consumer fetched: nothing yet.
    assert c.get_watermark_offsets(TopicPartition(topic, 2), cached=True) == (-1001, -1001)
    with pytest.raises(KafkaException):
        c.get_watermark_offsets(TopicPartition(bed.name("missing"), 0), timeout=5)


def test_partition_eof_events_when_enabled(bed: BrokerBed) -> None:
    topic = bed.topic(1)
    bed.produce(topic, "x")
    c = bed.consumer(bed.group(), **{"enable.partition.eof": True})
    c.subscribe([topic])
    got: list[Any] = []
    poll_until(lambda: KafkaError._PARTITION_EOF in codes(got), c, into=got)
    assert [m.error() is None for m in got] == [True, False]
    assert codes(got) == [KafkaError._PARTITION_EOF]


# -- producing --------------------------------------------------------------------------------


def test_keyed_records_keep_their_partition(bed: BrokerBed) -> None:
    topic = bed.topic(8)
    p = bed.producer()
    for i in range(40):
        p.produce(topic, value=str(i), key=f"k{i % 5}")
    assert p.flush(30) == 0
    by_key: dict[bytes | None, set[int | None]] = {}
    for m in bed.read(topic):
        by_key.setdefault(m.key(), set()).add(m.partition())
    assert all(len(parts) == 1 for parts in by_key.values()) and len(by_key) == 5


def test_delivery_reports_are_served_by_poll_on_the_calling_thread(bed: BrokerBed) -> None:
    topic = bed.topic(1)
    p = bed.producer()
    reports: list[tuple[Any, Any, str]] = []
    p.produce(
        topic,
        value=b"a",
        on_delivery=lambda e, m: reports.append((e, m, threading.current_thread().name)),
    )
    assert len(p) == 1 and reports == []  # not reported until polled
    deadline = time.monotonic() + 30
    while not reports:
        assert time.monotonic() < deadline
        p.poll(0.1)
    err, msg, thread = reports[0]
    assert err is None and (msg.topic(), msg.partition(), msg.offset()) == (topic, 0, 0)
    assert thread == threading.current_thread().name and len(p) == 0
    assert [m.value() for m in bed.read(topic)] == [b"a"]


def test_produce_to_an_unknown_partition_fails(bed: BrokerBed) -> None:
    topic = bed.topic(2)
    p = bed.producer()
    p.list_topics(topic, timeout=10)  # librdkafka checks partitions against known metadata
    with pytest.raises(KafkaException) as info:
        p.produce(topic, value=b"x", partition=5)
    assert error_code(info.value) == KafkaError._UNKNOWN_PARTITION


def test_produce_to_an_unknown_topic_fails_its_delivery_then_produce(bed: BrokerBed) -> None:
    """The test brokers do not auto-create topics. The first record fails delivery once
    metadata says the topic is missing; produce() itself raises for the next one."""
    missing = bed.name("missing")
    p = bed.producer(**{"topic.metadata.propagation.max.ms": 1000})
    reports: list[Any] = []
    p.produce(missing, value=b"x", on_delivery=lambda e, _m: reports.append(e))
    assert p.flush(30) == 0
    assert [e.code() for e in reports] == [KafkaError.UNKNOWN_TOPIC_OR_PART]
    with pytest.raises(KafkaException) as info:
        p.produce(missing, value=b"y")
    assert error_code(info.value) == KafkaError._UNKNOWN_TOPIC


def test_subscribing_to_an_unknown_topic_reports_it_then_assigns_it_once_created(
    bed: BrokerBed,
) -> None:
    missing = bed.name("later")
    c = bed.consumer(bed.group())
    c.subscribe([missing])
    got: list[Any] = []
    poll_until(lambda: bool(got), c, into=got, what="the unknown topic error")
    assert codes(got) == [KafkaError.UNKNOWN_TOPIC_OR_PART]
    bed.create_topic(missing, 2)
    poll_until(lambda: sizes(c) == [2], c, what="the new topic's partitions")


# -- failures ---------------------------------------------------------------------------------


def test_member_that_stops_polling_is_expelled_and_rejoins(bed: BrokerBed) -> None:
    topic, group = bed.topic(2), bed.group()
    log: Log = []
    # librdkafka wants max.poll.interval.ms >= session.timeout.ms (at least 1 s on the broker).
    slow = {"max.poll.interval.ms": 1500, "session.timeout.ms": 1500}
    a = bed.consumer(group, "a", **slow)
    b = bed.consumer(group, "b")
    join(a, log, "a", topic)
    join(b, log, "b", topic)
    poll_until(lambda: sizes(a, b) == [1, 1], a, b)
    mine = owned(a)
    poll_until(lambda: owned(b) == [0, 1], b, what="a to be expelled")  # a does not poll
    with pytest.raises(KafkaException):
        a.commit(offsets=[TopicPartition(topic, mine[0], 1)], asynchronous=False)
    got = a.consume(10, 1)
    assert got and codes(got)[:1] == [KafkaError._MAX_POLL_EXCEEDED]
    poll_until(lambda: ("a", "lost", mine) in log, a, b)
    poll_until(lambda: sizes(a, b) == [1, 1], a, b, what="a to rejoin")


def test_static_member_that_closes_keeps_its_partitions_until_session_timeout(
    bed: BrokerBed,
) -> None:
    """KIP-345: a static member's close() revokes locally but does not leave the group."""
    topic, group = bed.topic(4), bed.group()
    log: Log = []
    static = {"group.instance.id": bed.name("pod"), "session.timeout.ms": 3000}
    a, b = bed.consumer(group, "a", **static), bed.consumer(group, "b")
    join(a, log, "a", topic)
    join(b, log, "b", topic)
    poll_until(lambda: sizes(a, b) == [2, 2], a, b)
    mine, theirs = owned(a), owned(b)
    a.close()
    assert ("a", "revoke", mine) in log  # the application still gets its revoke
    drain(b, rounds=3)
    assert owned(b) == theirs  # nobody takes a's partitions while its session lasts
    poll_until(lambda: owned(b) == [0, 1, 2, 3], b, what="the session timeout")


def test_static_member_that_comes_back_gets_its_partitions_without_a_rebalance(
    bed: BrokerBed,
) -> None:
    topic, group = bed.topic(4), bed.group()
    log: Log = []
    static = {"group.instance.id": bed.name("pod"), "session.timeout.ms": 60000}
    a, b = bed.consumer(group, "a", **static), bed.consumer(group, "b")
    join(a, log, "a", topic)
    join(b, log, "b", topic)
    poll_until(lambda: sizes(a, b) == [2, 2], a, b)
    drain(a, b)
    mine, theirs = owned(a), owned(b)
    a.close()
    log.clear()
    again = bed.consumer(group, "a2", **static)
    join(again, log, "a2", topic)
    poll_until(lambda: owned(again) == mine, again, b)
    drain(again, b)
    assert owned(b) == theirs
    assert log == [("a2", "assign", mine)]  # b saw nothing: no rebalance


def test_second_consumer_with_the_same_instance_id_fences_the_first(bed: BrokerBed) -> None:
    topic, group = bed.topic(2), bed.group()
    log: Log = []
    static = {"group.instance.id": bed.name("pod")}
    first = bed.consumer(group, "first", **static)
    join(first, log, "first", topic)
    poll_until(lambda: sizes(first) == [2], first)
    second = bed.consumer(group, "second", **static)
    join(second, log, "second", topic)
    poll_until(lambda: owned(second) == [0, 1], second)
    got: list[Any] = []

    def fenced() -> bool:
        got.extend(first.consume(10, 0.1))
        return bool(codes(got))

    poll_until(fenced, what="the first consumer to be fenced")
    # librdkafka raises a fatal error: an event whose code is _FATAL and whose text names
    # the cause; the event's own fatal() is False, so only the code tells it apart.
    err = next(m.error() for m in got if m.error() is not None)
    assert err.code() == KafkaError._FATAL and not err.fatal()
    assert "fenced" in err.str()


# -- share groups (KIP-932): queue mode -----------------------------------------------------
# A share group starts at the log end unless told otherwise, so each test sets
# share.auto.offset.reset=earliest first, as the worker does from spec.source.startFrom.

ACCEPT, RELEASE, REJECT = 1, 2, 3  # confluent_kafka.AcknowledgeType


def share_group(bed: BrokerBed, **settings: str) -> str:
    group = bed.group()
    bed.configure_share_group(group, share_auto_offset_reset="earliest", **settings)
    return group


def share_poll(c: Any, want: int, timeout: float = SETTLE_TIMEOUT) -> list[Any]:
    """Poll until ``want`` records arrived (the first poll joins the group: seconds on Kafka).
    The caller acknowledges; records are returned as they came, all of one poll at most."""
    deadline = time.monotonic() + timeout
    got: list[Any] = []
    while len(got) < want:
        assert time.monotonic() < deadline, f"timed out: {len(got)} of {want} records"
        got += [m for m in c.poll(0.5) if m.error() is None]
        if got and len(got) < want:
            break  # a poll's records must be acknowledged before the next poll
    return got


def test_share_group_hands_each_record_to_one_of_more_members_than_partitions(
    bed: BrokerBed,
) -> None:
    """Kafka assigns a partition to several members of a share group (re-assigned every
    share.assignment.interval.ms, a second): members that join later get work once the group
    has taken them in, so records keep coming until every member received some."""
    topic, group = bed.topic(2), share_group(bed)
    cs = [bed.share_consumer(group, f"s{i}", **{"max.poll.records": 10}) for i in range(3)]
    for c in cs:
        c.subscribe([topic])
    p = bed.producer()
    seen: list[list[tuple[int, int]]] = [[] for _ in cs]
    produced = 0
    deadline = time.monotonic() + SETTLE_TIMEOUT * 2
    while not all(seen) or sum(map(len, seen)) < produced:
        assert time.monotonic() < deadline, [len(v) for v in seen]
        if not all(seen):
            for _ in range(60):  # more than the members' polls take: some left for each
                p.produce(topic, value=str(produced), partition=produced % 2)
                produced += 1
            p.flush(10)
        for c, mine in zip(cs, seen, strict=True):
            for m in c.poll(0.2):
                mine.append((m.partition(), m.offset()))
                c.acknowledge(m, ACCEPT)
            c.commit_async()
    everything = [r for v in seen for r in v]
    assert len(everything) == len(set(everything)) == produced  # each record once, none lost


def test_released_record_comes_back_with_a_higher_delivery_count(bed: BrokerBed) -> None:
    topic, group = bed.topic(1), share_group(bed)
    bed.produce(topic, value="r")
    c = bed.share_consumer(group)
    c.subscribe([topic])
    (first,) = share_poll(c, 1)
    assert first.delivery_count() == 1
    c.acknowledge(first, RELEASE)
    (again,) = share_poll(c, 1)
    assert (again.offset(), again.delivery_count()) == (first.offset(), 2)
    c.acknowledge(again, ACCEPT)
    c.commit_sync(SETTLE_TIMEOUT)
    assert [m for m in c.poll(1.0) if m.error() is None] == []


def test_rejected_record_is_never_delivered_again(bed: BrokerBed) -> None:
    topic, group = bed.topic(1), share_group(bed)
    bed.produce(topic, value="poison")
    bed.produce(topic, value="fine")
    c = bed.share_consumer(group)
    c.subscribe([topic])
    got = share_poll(c, 2)
    for m in got:
        c.acknowledge(m, REJECT if m.value() == b"poison" else ACCEPT)
    c.commit_sync(SETTLE_TIMEOUT)
    assert [m for m in c.poll(1.5) if m.error() is None] == []


def test_delivery_count_limit_archives_a_record_released_that_often(bed: BrokerBed) -> None:
    topic, group = bed.topic(1), share_group(bed, share_delivery_count_limit="2")
    bed.produce(topic, value="r")
    c = bed.share_consumer(group)
    c.subscribe([topic])
    for count in (1, 2):
        (m,) = share_poll(c, 1)
        assert m.delivery_count() == count
        c.acknowledge(m, RELEASE)
    c.commit_sync(SETTLE_TIMEOUT)
    assert [m for m in c.poll(1.5) if m.error() is None] == []


def test_expired_lock_delivers_the_record_again_and_refuses_the_late_acknowledgement(
    bed: BrokerBed,
) -> None:
    topic, group = bed.topic(1), share_group(bed, share_record_lock_duration_ms="1000")
    bed.produce(topic, value="slow")
    a, b = bed.share_consumer(group, "a"), bed.share_consumer(group, "b")
    results: list[Any] = []
    a.set_acknowledgement_commit_callback(lambda offsets, err: results.append(err))
    a.subscribe([topic])
    (held,) = share_poll(a, 1)
    b.subscribe([topic])
    (again,) = share_poll(b, 1)  # after a's lock expired
    assert (again.offset(), again.delivery_count()) == (held.offset(), 2)
    a.acknowledge(held, ACCEPT)  # too late: the broker refuses it
    outcome = a.commit_sync(SETTLE_TIMEOUT)
    assert [error_code(e) for e in outcome.values()] == [KafkaError.INVALID_RECORD_STATE]
    assert len(results) == 1 and error_code(results[0]) == KafkaError.INVALID_RECORD_STATE
    b.acknowledge(again, ACCEPT)
    b.commit_sync(SETTLE_TIMEOUT)


def test_share_group_starts_at_the_log_end_unless_configured(bed: BrokerBed) -> None:
    topic = bed.topic(1)
    bed.produce(topic, value="before")
    latest, earliest = bed.group(), share_group(bed)
    c, d = bed.share_consumer(latest, "c"), bed.share_consumer(earliest, "d")
    c.subscribe([topic])
    d.subscribe([topic])
    assert [m.value() for m in share_poll(d, 1)] == [b"before"]
    d.acknowledge_offset(topic, 0, 0, ACCEPT)
    # c's group started at the log end: only what is produced after its start reaches it.
    poll_for = time.monotonic() + 6
    early: list[Any] = []
    while time.monotonic() < poll_for:
        early += [m for m in c.poll(0.5) if m.error() is None]
    assert early == []
    bed.produce(topic, value="after")
    assert [m.value() for m in share_poll(c, 1)] == [b"after"]


def test_polling_again_before_acknowledging_is_refused(bed: BrokerBed) -> None:
    topic, group = bed.topic(1), share_group(bed)
    bed.produce(topic, value="r")
    c = bed.share_consumer(group)
    c.subscribe([topic])
    (m,) = share_poll(c, 1)
    with pytest.raises(IllegalStateException, match="not been acknowledged"):
        c.poll(0.1)
    c.acknowledge(m, ACCEPT)


def test_closing_releases_what_a_member_held(bed: BrokerBed) -> None:
    topic, group = bed.topic(1), share_group(bed)
    bed.produce(topic, value="r")
    a, b = bed.share_consumer(group, "a"), bed.share_consumer(group, "b")
    a.subscribe([topic])
    share_poll(a, 1)
    a.close()  # nothing acknowledged: the record goes back at once, no lock to wait for
    b.subscribe([topic])
    began = time.monotonic()
    (again,) = share_poll(b, 1)
    assert again.value() == b"r"
    assert time.monotonic() - began < 25  # sooner than the 30 s lock
    b.acknowledge(again, ACCEPT)
