"""The in-memory broker alone: groups, rebalances, offsets, flow control and test hooks.

These pin the librdkafka behaviours the engine relies on, so that a pipeline that passes on
the memory broker has been exercised against the same contract as on Kafka.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from offtake.kafka.memory import ClientKilled, MemoryBroker, MemoryConsumer

COOP = "cooperative-sticky"


class Recorder:
    """Rebalance callbacks that log (consumer name, kind, partitions) in a shared list."""

    def __init__(self, log: list[tuple[str, str, list[int]]], name: str) -> None:
        self.log, self.name = log, name
        self.threads: set[str] = set()

    def cb(self, kind: str) -> Callable[[Any, list[Any]], None]:
        def callback(consumer: Any, parts: list[Any]) -> None:
            self.threads.add(threading.current_thread().name)
            self.log.append((self.name, kind, sorted(p.partition for p in parts)))

        return callback


def consumer(
    broker: MemoryBroker, name: str = "c", strategy: str = COOP, **conf: Any
) -> MemoryConsumer:
    config = {
        "group.id": "g",
        "client.id": name,
        "partition.assignment.strategy": strategy,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": "false",
        **conf,
    }
    return broker.clients().consumer(config)


def join(
    c: MemoryConsumer, log: list[tuple[str, str, list[int]]], name: str, topic: str = "t"
) -> Recorder:
    r = Recorder(log, name)
    c.subscribe([topic], on_assign=r.cb("assign"), on_revoke=r.cb("revoke"), on_lost=r.cb("lost"))
    return r


def settle(*consumers: MemoryConsumer, rounds: int = 4) -> list[Any]:
    msgs: list[Any] = []
    for _ in range(rounds):
        for c in consumers:
            msgs.extend(c.consume(1000, 0.01))
    return msgs


def owned(c: MemoryConsumer) -> list[int]:
    return sorted(tp.partition for tp in c.assignment())


@pytest.mark.parametrize("strategy", [COOP, "range", "roundrobin"])
def test_three_consumers_share_twelve_partitions(strategy: str) -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 12)
    log: list[tuple[str, str, list[int]]] = []
    cs = [consumer(broker, f"c{i}", strategy) for i in range(3)]
    for i, c in enumerate(cs):
        join(c, log, f"c{i}")
    settle(*cs)
    parts = [owned(c) for c in cs]
    assert [len(p) for p in parts] == [4, 4, 4]
    assert sorted(p for ps in parts for p in ps) == list(range(12))
    assert broker.assignment("g") == {c.memberid(): [("t", p) for p in owned(c)] for c in cs}


def test_records_reach_exactly_one_member_in_partition_order() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 12)
    for i in range(240):
        broker.produce("t", {"i": i}, key=str(i))
    cs = [consumer(broker, f"c{i}") for i in range(3)]
    for c in cs:
        c.subscribe(["t"])
    got = settle(*cs, rounds=6)
    assert sorted(m.offset() for m in got if m.partition() == 0) == [
        m.offset() for m in got if m.partition() == 0
    ]
    assert len(got) == 240
    assert len({(m.partition(), m.offset()) for m in got}) == 240


def test_cooperative_rebalance_moves_only_some_partitions() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 12)
    log: list[tuple[str, str, list[int]]] = []
    a, b = consumer(broker, "a"), consumer(broker, "b")
    join(a, log, "a")
    join(b, log, "b")
    settle(a, b)
    before = {"a": owned(a), "b": owned(b)}
    assert len(before["a"]) == len(before["b"]) == 6
    log.clear()
    c = consumer(broker, "c")
    join(c, log, "c")
    settle(a, b, c)
    after = {"a": owned(a), "b": owned(b), "c": owned(c)}
    assert [len(p) for p in after.values()] == [4, 4, 4]
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


def test_cooperative_new_owner_waits_for_the_old_owners_revoke() -> None:
    """A moved partition is assigned only after the old owner's on_revoke has returned."""
    broker = MemoryBroker()
    broker.create_topic("t", 4)
    timeline: list[tuple[float, str, list[int]]] = []
    a, b = consumer(broker, "a"), consumer(broker, "b")
    revoke_started = threading.Event()

    def slow_revoke(_c: Any, parts: list[Any]) -> None:
        revoke_started.set()
        time.sleep(0.5)  # e.g. draining in-flight work and committing
        timeline.append((time.monotonic(), "a-revoke-done", [p.partition for p in parts]))

    def b_assign(_c: Any, parts: list[Any]) -> None:
        timeline.append((time.monotonic(), "b-assign", sorted(p.partition for p in parts)))

    a.subscribe(["t"], on_revoke=slow_revoke)
    settle(a)
    assert owned(a) == [0, 1, 2, 3]
    b.subscribe(["t"], on_assign=b_assign)
    stop = threading.Event()

    def poll_a() -> None:
        while not stop.is_set():
            a.consume(10, 0.05)

    t = threading.Thread(target=poll_a)
    t.start()
    try:
        assert revoke_started.wait(5)
        # While a's on_revoke runs, b polls but gets nothing of a's: nobody owns twice.
        deadline = time.monotonic() + 5
        while (
            not any(e[1] == "b-assign" and e[2] for e in timeline) and time.monotonic() < deadline
        ):
            b.consume(10, 0.05)
            assert not set(owned(a)) & set(owned(b))
    finally:
        stop.set()
        t.join()
    done = next(e for e in timeline if e[1] == "a-revoke-done")
    given = next(e for e in timeline if e[1] == "b-assign" and e[2])
    assert sorted(done[2]) == given[2] and len(given[2]) == 2
    assert given[0] >= done[0]
    kinds = [
        (e.member[0], e.kind)
        for e in broker.events("g")
        if e.kind in ("revoke", "assign") and e.partitions
    ]
    assert kinds.index(("a", "revoke")) < kinds.index(("b", "assign"))


def test_eager_rebalance_revokes_everything() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 6)
    log: list[tuple[str, str, list[int]]] = []
    a, b = consumer(broker, "a", "range"), consumer(broker, "b", "range")
    join(a, log, "a")
    settle(a)
    assert owned(a) == list(range(6))
    log.clear()
    join(b, log, "b")
    settle(a, b)
    assert ("a", "revoke", list(range(6))) in log
    assert log.index(("a", "revoke", list(range(6)))) < log.index(("b", "assign", [3, 4, 5]))
    assert ("a", "assign", [0, 1, 2]) in log  # the full new assignment, not an increment
    assert owned(a) == [0, 1, 2] and owned(b) == [3, 4, 5]


def test_assign_must_match_the_rebalance_protocol() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 2)
    c = consumer(broker)
    c.subscribe(["t"])
    with pytest.raises(KafkaException) as info:
        c.assign([TopicPartition("t", 0)])
    assert info.value.args[0].code() == KafkaError._STATE
    e = consumer(broker, "e", "range", **{"group.id": "other"})
    e.subscribe(["t"])
    with pytest.raises(KafkaException):
        e.incremental_assign([TopicPartition("t", 0)])


def test_mixed_protocols_in_one_group_are_refused() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 2)
    consumer(broker, "a").subscribe(["t"])
    with pytest.raises(KafkaException) as info:
        consumer(broker, "b", "range").subscribe(["t"])
    assert info.value.args[0].code() == KafkaError.INCONSISTENT_GROUP_PROTOCOL


def test_callbacks_run_inside_consume_on_the_calling_thread() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 2)
    log: list[tuple[str, str, list[int]]] = []
    c = consumer(broker)
    r = join(c, log, "c")
    assert log == []  # subscribe() only joins; the assignment arrives in consume()
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.extend(c.consume(10, 0.05)), name="poller")
    t.start()
    t.join()
    assert log == [("c", "assign", [0, 1])] and r.threads == {"poller"}


def test_commit_and_committed() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 2)
    commits: list[tuple[Any, list[Any]]] = []
    c = consumer(broker, on_commit=lambda err, parts: commits.append((err, parts)))
    c.subscribe(["t"])
    settle(c)
    result = c.commit(offsets=[TopicPartition("t", 0, 5)], asynchronous=False)
    assert [(p.topic, p.partition, p.offset) for p in result] == [("t", 0, 5)]
    assert commits == []  # like confluent-kafka, a synchronous commit does not call on_commit
    assert broker.committed("g", "t", 0) == 5
    assert broker.committed("g", "t", 1) is None
    assert [p.offset for p in c.committed([TopicPartition("t", 0), TopicPartition("t", 1)])] == [
        5,
        -1001,
    ]
    assert c.commit(offsets=[TopicPartition("t", 1, 7)]) is None  # asynchronous by default
    assert broker.committed("g", "t", 1) == 7
    assert commits == []  # served by the next consume(), not from commit()
    c.consume(1, 0)
    assert len(commits) == 1
    err, parts = commits[0]
    assert err is None and [(p.partition, p.offset) for p in parts] == [(1, 7)]


def test_commit_for_a_partition_not_owned_is_rejected() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 2)
    commits: list[tuple[Any, list[Any]]] = []
    a = consumer(broker, "a", on_commit=lambda err, parts: commits.append((err, parts)))
    b = consumer(broker, "b")
    a.subscribe(["t"])
    b.subscribe(["t"])
    settle(a, b)
    mine, theirs = owned(a)[0], owned(b)[0]
    with pytest.raises(KafkaException) as info:
        a.commit(offsets=[TopicPartition("t", theirs, 3)], asynchronous=False)
    err = info.value.args[0]
    assert err.code() == KafkaError.ILLEGAL_GENERATION
    assert f"t[{theirs}]@3" in err.str() and "not assigned" in err.str()
    a.commit(offsets=[TopicPartition("t", theirs, 4)], asynchronous=True)
    a.consume(1, 0)
    assert (
        commits
        and commits[-1][0] is not None
        and commits[-1][0].code() == KafkaError.ILLEGAL_GENERATION
    )
    assert broker.committed("g", "t", theirs) is None
    assert len(broker.rejected_commits) == 2
    # All or nothing: a commit naming one foreign partition stores none of them.
    with pytest.raises(KafkaException):
        a.commit(
            offsets=[TopicPartition("t", mine, 1), TopicPartition("t", theirs, 1)],
            asynchronous=False,
        )
    assert broker.committed("g", "t", mine) is None


def test_commit_inside_on_revoke_is_accepted_and_after_it_rejected() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 2)
    for i in range(10):
        broker.produce("t", i, partition=i % 2)
    a = consumer(broker, "a")
    revoked: list[int] = []

    def on_revoke(c: Any, parts: list[Any]) -> None:
        c.commit(
            offsets=[TopicPartition(p.topic, p.partition, 5) for p in parts], asynchronous=False
        )
        revoked.extend(p.partition for p in parts)

    a.subscribe(["t"], on_revoke=on_revoke)
    settle(a)
    b = consumer(broker, "b")
    b.subscribe(["t"])
    settle(a, b)
    assert len(revoked) == 1
    assert broker.committed("g", "t", revoked[0]) == 5
    with pytest.raises(KafkaException):
        a.commit(offsets=[TopicPartition("t", revoked[0], 6)], asynchronous=False)
    # The new owner starts from the committed offset.
    assert broker.committed("g", "t", revoked[0]) == 5
    b.commit(offsets=[TopicPartition("t", revoked[0], 5)], asynchronous=False)


def test_new_owner_starts_at_committed_offset_else_auto_offset_reset() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 1)
    for i in range(10):
        broker.produce("t", i)
    broker.set_committed("g", "t", 0, 7)
    c = consumer(broker)
    c.subscribe(["t"])
    assert [m.offset() for m in settle(c)] == [7, 8, 9]
    late = consumer(broker, "late", **{"group.id": "fresh", "auto.offset.reset": "latest"})
    late.subscribe(["t"])
    assert settle(late) == []
    broker.produce("t", 10)
    assert [m.offset() for m in settle(late)] == [10]
    early = consumer(broker, "early", **{"group.id": "fresh2"})
    early.subscribe(["t"])
    assert len(settle(early)) == 11


def test_messages_look_like_confluent_messages() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 1)
    broker.produce("t", b"v", key="k", headers=[("h", b"1")], timestamp=1234)
    c = consumer(broker)
    c.subscribe(["t"])
    (m,) = settle(c)
    assert (m.error(), m.topic(), m.partition(), m.offset()) == (None, "t", 0, 0)
    assert (m.key(), m.value(), m.headers(), m.timestamp()) == (
        b"k",
        b"v",
        [("h", b"1")],
        (1, 1234),
    )
    assert broker.produce("t", {"a": 1}).value() == b'{"a":1}'


def test_pause_stops_delivery_until_resume() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 2)
    c = consumer(broker)
    c.subscribe(["t"])
    settle(c)
    c.pause([TopicPartition("t", 0)])
    for i in range(6):
        broker.produce("t", i, partition=i % 2)
    got = settle(c)
    assert {m.partition() for m in got} == {1} and len(got) == 3
    c.resume([TopicPartition("t", 0)])
    assert [m.offset() for m in settle(c)] == [0, 1, 2]


def test_consume_waits_and_is_woken_by_produce() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 1)
    c = consumer(broker)
    c.subscribe(["t"])
    settle(c)
    threading.Timer(0.2, lambda: broker.produce("t", "x")).start()
    started = time.monotonic()
    got = c.consume(10, 5.0)
    assert len(got) == 1 and 0.15 < time.monotonic() - started < 2.0
    started = time.monotonic()
    assert c.consume(10, 0.2) == []
    assert time.monotonic() - started >= 0.19


def test_watermarks_and_end_offsets() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 3)
    for i in range(7):
        broker.produce("t", i, partition=i % 3)
    c = consumer(broker)
    assert c.get_watermark_offsets(TopicPartition("t", 0)) == (0, 3)
    assert c.get_watermark_offsets(TopicPartition("t", 2)) == (0, 2)
    assert c.get_watermark_offsets(TopicPartition("t", 2), cached=True) == (
        -1001,
        -1001,
    )  # not fetched
    assert broker.end_offsets("t") == {0: 3, 1: 2, 2: 2}
    with pytest.raises(KafkaException):
        c.get_watermark_offsets(TopicPartition("nope", 0))
    assert broker.lag("g") == {("t", 0): 3, ("t", 1): 2, ("t", 2): 2}


def test_keyed_records_keep_their_partition() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 8)
    p = broker.clients().producer({})
    for i in range(40):
        p.produce("t", value=str(i), key=f"k{i % 5}")
    assert p.flush(1) == 0
    by_key: dict[bytes | None, set[int | None]] = {}
    for m in broker.records("t"):
        by_key.setdefault(m.key(), set()).add(m.partition())
    assert all(len(parts) == 1 for parts in by_key.values()) and len(by_key) == 5


def test_delivery_reports_are_served_by_poll_on_the_calling_thread() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 1)
    p = broker.clients().producer({})
    reports: list[tuple[Any, Any, str]] = []
    p.produce(
        "t",
        value=b"a",
        on_delivery=lambda e, m: reports.append((e, m, threading.current_thread().name)),
    )
    assert len(p) == 1 and reports == []  # written, but not reported until polled
    assert [m.value() for m in broker.records("t")] == [b"a"]
    assert p.poll(0) == 1
    err, msg, thread = reports[0]
    assert err is None and (msg.topic(), msg.partition(), msg.offset()) == ("t", 0, 0)
    assert thread == threading.current_thread().name and len(p) == 0


def test_stalled_topic_holds_deliveries_then_writes_them_in_order() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 1)
    p = broker.clients().producer({})
    reports: list[Any] = []
    broker.stall("t", 0.5)
    for i in range(3):
        p.produce("t", value=str(i), on_delivery=lambda e, m: reports.append((e, m.offset())))
    assert p.flush(0.1) == 3 and len(p) == 3 and reports == []
    assert broker.records("t") == []
    assert p.flush(5) == 0
    assert reports == [(None, 0), (None, 1), (None, 2)]
    assert [m.value() for m in broker.records("t")] == [b"0", b"1", b"2"]


def test_stall_longer_than_message_timeout_fails_delivery() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 1)
    p = broker.clients().producer({"message.timeout.ms": "200"})
    reports: list[Any] = []
    broker.stall("t")  # until unstall
    p.produce("t", value=b"x", on_delivery=lambda e, m: reports.append(e))
    assert p.flush(2) == 0
    assert reports[0].code() == KafkaError._MSG_TIMED_OUT
    broker.unstall("t")
    assert broker.records("t") == []


def test_full_queue_raises_buffer_error() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 1)
    p = broker.clients().producer({"queue.buffering.max.messages": "2"})
    broker.stall("t")
    p.produce("t", value=b"1")
    p.produce("t", value=b"2")
    with pytest.raises(BufferError):
        p.produce("t", value=b"3")
    broker.unstall("t")
    assert p.flush(1) == 0
    p.produce("t", value=b"3")


def test_fail_produce_fails_the_next_deliveries_without_writing() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 1)
    p = broker.clients().producer({})
    reports: list[Any] = []
    broker.fail_produce("t", 2)
    for i in range(3):
        p.produce("t", value=str(i), on_delivery=lambda e, m: reports.append(e))
    p.flush(1)
    assert [e is not None and e.code() == KafkaError._MSG_TIMED_OUT for e in reports] == [
        True,
        True,
        False,
    ]
    assert [m.value() for m in broker.records("t")] == [b"2"]


def test_close_revokes_on_self_then_others_take_over() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 4)
    log: list[tuple[str, str, list[int]]] = []
    a, b = consumer(broker, "a"), consumer(broker, "b")
    join(a, log, "a")
    join(b, log, "b")
    settle(a, b)
    mine = owned(a)
    a.close()
    assert ("a", "revoke", mine) in log
    settle(b)
    assert owned(b) == [0, 1, 2, 3]
    assert len(broker.members("g")) == 1
    with pytest.raises(RuntimeError):
        a.consume(1, 0)


def test_killed_member_loses_its_partitions_without_revoke_or_commit() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 2)
    for i in range(20):
        broker.produce("t", i, partition=i % 2)
    log: list[tuple[str, str, list[int]]] = []
    clients = broker.clients("victim")
    a = clients.consumer(
        {
            "group.id": "g",
            "partition.assignment.strategy": COOP,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    join(a, log, "a")
    b = consumer(broker, "b")
    join(b, log, "b")
    settle(a, b)
    mine = owned(a)
    a.commit(offsets=[TopicPartition("t", mine[0], 4)], asynchronous=False)
    clients.kill()
    assert not [
        entry for entry in log if entry[0] == "a" and entry[1] in ("revoke", "lost") and entry[2]
    ]
    with pytest.raises(ClientKilled):
        a.consume(1, 0)
    with pytest.raises(ClientKilled):
        a.close()
    got = settle(b)
    assert owned(b) == [0, 1]
    assert min(m.offset() for m in got if m.partition() == mine[0]) == 4  # from the commit
    assert [e.kind for e in broker.events("g") if e.member.startswith("victim")][-1] == "lost"


def test_member_that_stops_polling_is_expelled_and_rejoins() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 2)
    log: list[tuple[str, str, list[int]]] = []
    a = consumer(broker, "a", **{"max.poll.interval.ms": "300"})
    b = consumer(broker, "b")
    join(a, log, "a")
    join(b, log, "b")
    settle(a, b)
    mine = owned(a)
    deadline = time.monotonic() + 3
    while owned(b) != [0, 1] and time.monotonic() < deadline:  # a does not poll
        b.consume(10, 0.05)
    assert owned(b) == [0, 1]
    with pytest.raises(KafkaException):
        a.commit(offsets=[TopicPartition("t", mine[0], 1)], asynchronous=False)
    got = a.consume(10, 0.05)
    assert got and got[0].error().code() == KafkaError._MAX_POLL_EXCEEDED
    assert ("a", "lost", mine) in log
    settle(a, b)
    assert len(owned(a)) == len(owned(b)) == 1  # a rejoined as a new member


def test_partition_eof_events_when_enabled() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 1)
    broker.produce("t", "x")
    c = consumer(broker, **{"enable.partition.eof": "true"})
    c.subscribe(["t"])
    got = settle(c)
    assert [m.error() is None for m in got] == [True, False]
    assert got[1].error().code() == KafkaError._PARTITION_EOF


def test_auto_commit_commits_consumed_offsets_like_librdkafka_defaults() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 1)
    for i in range(5):
        broker.produce("t", i)
    c = broker.clients().consumer(
        {"group.id": "auto", "auto.offset.reset": "earliest", "auto.commit.interval.ms": "0"}
    )
    c.subscribe(["t"])
    settle(c)
    assert broker.committed("auto", "t", 0) == 5


def test_new_topic_partitions_rebalance_subscribers() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 1)
    c = consumer(broker)
    c.subscribe(["t"])
    settle(c)
    broker.create_partitions("t", 3)
    settle(c)
    assert owned(c) == [0, 1, 2]
    c2 = consumer(broker, "re", **{"group.id": "rx"})
    c2.subscribe(["^t.*"])
    broker.create_topic("t2", 2)
    settle(c2)
    assert sorted((tp.topic, tp.partition) for tp in c2.assignment()) == [
        ("t", 0),
        ("t", 1),
        ("t", 2),
        ("t2", 0),
        ("t2", 1),
    ]


def test_static_member_that_closes_keeps_its_partitions_until_session_timeout() -> None:
    """KIP-345: a static member's close() revokes locally but does not leave the group."""
    broker = MemoryBroker()
    broker.create_topic("t", 4)
    log: list[tuple[str, str, list[int]]] = []
    static = {"group.instance.id": "pod-0", "session.timeout.ms": "600"}
    a, b = consumer(broker, "a", **static), consumer(broker, "b")
    join(a, log, "a")
    join(b, log, "b")
    settle(a, b)
    mine = owned(a)
    generation = broker.generation("g")
    a.close()
    assert ("a", "revoke", mine) in log  # the application still gets its revoke
    settle(b)
    assert owned(b) != [0, 1, 2, 3] and broker.generation("g") == generation
    deadline = time.monotonic() + 5
    while owned(b) != [0, 1, 2, 3] and time.monotonic() < deadline:
        b.consume(10, 0.05)
    assert owned(b) == [0, 1, 2, 3]  # after session.timeout.ms
    kinds = [e.kind for e in broker.events("g") if e.member.startswith("a-")]
    assert kinds[-2:] == ["depart", "lost"]


def test_static_member_that_comes_back_gets_its_partitions_without_a_rebalance() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 4)
    log: list[tuple[str, str, list[int]]] = []
    static = {"group.instance.id": "pod-0", "session.timeout.ms": "60000"}
    a, b = consumer(broker, "a", **static), consumer(broker, "b")
    join(a, log, "a")
    join(b, log, "b")
    settle(a, b)
    mine, theirs = owned(a), owned(b)
    a.close()
    log.clear()
    again = consumer(broker, "a2", **static)
    join(again, log, "a2")
    settle(again, b)
    assert owned(again) == mine and owned(b) == theirs
    assert log == [("a2", "assign", mine)]  # b saw nothing: no rebalance


def test_second_consumer_with_the_same_instance_id_fences_the_first() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 2)
    log: list[tuple[str, str, list[int]]] = []
    static = {"group.instance.id": "pod-0"}
    first = consumer(broker, "first", **static)
    join(first, log, "first")
    settle(first)
    second = consumer(broker, "second", **static)
    join(second, log, "second")
    settle(second)
    assert owned(second) == [0, 1]
    got = first.consume(10, 0.05)
    assert got[0].error().code() == KafkaError.FENCED_INSTANCE_ID and got[0].error().fatal()
    assert ("first", "lost", [0, 1]) in log
    assert first.consume(10, 0.05) == []  # fenced for good: it does not rejoin
    assert broker.members("g") == [second.memberid()]


def test_position_is_unknown_until_a_record_is_returned_like_librdkafka() -> None:
    """position() is one past the last record returned, not where fetching will start."""
    broker = MemoryBroker()
    broker.create_topic("t", 1)
    for i in range(5):
        broker.produce("t", i)
    broker.set_committed("g", "t", 0, 3)
    c = consumer(broker)
    c.subscribe(["t"])
    c.consume(0, 0.05)  # serves the assignment, returns no record
    assert [p.offset for p in c.position([TopicPartition("t", 0)])] == [-1001]
    assert [m.offset() for m in c.consume(1, 1)] == [3]
    assert [p.offset for p in c.position([TopicPartition("t", 0)])] == [4]
    c.seek(TopicPartition("t", 0, 1))
    assert [p.offset for p in c.position([TopicPartition("t", 0)])] == [-1001]
