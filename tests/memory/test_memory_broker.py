"""The memory broker's own API: test hooks, admin views and its deliberate strictness.

Kafka behaviour is tested in test_broker_behaviour.py, on this broker and on Apache Kafka
with the same test bodies. The tests here cannot run on Kafka, because their subject is
something only the memory broker has:

- test hooks: :meth:`MemoryBroker.fail_produce`, :meth:`MemoryBroker.stall`/``unstall`` and
  :meth:`MemoryClients.kill` (a simulated SIGKILL);
- admin views: :meth:`MemoryBroker.events`, ``assignment()``, ``generation()``,
  ``end_offsets()``, ``lag()``, and ``produce()`` of JSON values;
- a deliberate difference: a commit for a partition the member does not own is rejected
  (and listed in ``rejected_commits``). A real broker accepts it from a member of the
  current generation and silently overwrites the new owner's progress; on the memory broker
  it is a loud test failure, so that engine bugs of that kind cannot pass unnoticed.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from support.brokers import COOP, drain, join, owned

from offtake.kafka.memory import ClientKilled, MemoryBroker, MemoryConsumer


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


def settle(*consumers: MemoryConsumer) -> list[Any]:
    """Polls enough for the memory broker's group to settle (it answers at once)."""
    return drain(*consumers, rounds=4, wait=0.01)


# -- admin views --------------------------------------------------------------------------------


def test_assignment_and_events_show_the_handover() -> None:
    """events() records a's revoke before b's assign; assignment() is what members own."""
    broker = MemoryBroker()
    broker.create_topic("t", 4)
    a, b = consumer(broker, "a"), consumer(broker, "b")
    a.subscribe(["t"])
    settle(a)
    b.subscribe(["t"])
    settle(a, b)
    assert broker.assignment("g") == {c.memberid(): [("t", p) for p in owned(c)] for c in (a, b)}
    kinds = [
        (e.member[0], e.kind)
        for e in broker.events("g")
        if e.kind in ("revoke", "assign") and e.partitions
    ]
    assert kinds.index(("a", "revoke")) < kinds.index(("b", "assign"))


def test_admin_produce_writes_json_and_views_report_offsets_and_lag() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 3)
    assert broker.produce("t", {"a": 1}, partition=0).value() == b'{"a":1}'
    for i in range(6):
        broker.produce("t", i, partition=i % 3)
    assert broker.end_offsets("t") == {0: 3, 1: 2, 2: 2}
    assert broker.lag("g") == {("t", 0): 3, ("t", 1): 2, ("t", 2): 2}
    broker.set_committed("g", "t", 0, 2)
    assert broker.committed("g", "t", 0) == 2 and broker.lag("g")[("t", 0)] == 1


def test_static_member_departure_keeps_the_generation() -> None:
    """A static member's close() is a depart, not a leave: no new generation until it expires."""
    broker = MemoryBroker()
    broker.create_topic("t", 4)
    static = {"group.instance.id": "pod-0", "session.timeout.ms": "600"}
    a, b = consumer(broker, "a", **static), consumer(broker, "b")
    a.subscribe(["t"])
    b.subscribe(["t"])
    settle(a, b)
    generation = broker.generation("g")
    a.close()
    settle(b)
    assert broker.generation("g") == generation
    deadline = time.monotonic() + 5
    while owned(b) != [0, 1, 2, 3] and time.monotonic() < deadline:
        b.consume(10, 0.05)
    kinds = [e.kind for e in broker.events("g") if e.member.startswith("a-")]
    assert kinds[-2:] == ["depart", "lost"]


# -- deliberate strictness ----------------------------------------------------------------------


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


def test_commit_after_on_revoke_is_rejected() -> None:
    """Kafka would accept it within the generation; see the module docstring."""
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


# -- test hooks ---------------------------------------------------------------------------------


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
    join(a, log, "a", "t")
    b = consumer(broker, "b")
    join(b, log, "b", "t")
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
