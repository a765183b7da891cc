"""The memory broker against a real Kafka broker: the same client script, the same story.

Each scenario drives two consumers through join, rebalance, commits and close with
confluent-kafka's API, once on Apache Kafka (the testbed's KRaft broker) and once on the
memory broker, and checks that what the application observes has the same shape. This is
what justifies testing the engine on the memory broker.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from offtake.kafka.memory import MemoryBroker
from offtake_testbed.kafka import KafkaBroker

Log = list[tuple[str, str, Any]]
MakeConsumer = Callable[[dict[str, Any]], Any]


def _poll_until(condition: Callable[[], bool], *consumers: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the group did not settle"
        for c in consumers:
            c.consume(10, 0.1)


def _scenario(make: MakeConsumer, topic: str, strategy: str) -> Log:
    group = f"parity-{uuid.uuid4().hex[:8]}"
    log: Log = []
    commits: list[tuple[Any, list[int]]] = []

    def config(name: str) -> dict[str, Any]:
        return {
            "group.id": group,
            "partition.assignment.strategy": strategy,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "on_commit": lambda err, parts: commits.append((err, [p.partition for p in parts])),
        }

    def subscribe(c: Any, name: str) -> None:
        def cb(kind: str) -> Callable[[Any, list[Any]], None]:
            return lambda _c, parts: log.append((name, kind, sorted(p.partition for p in parts)))

        c.subscribe([topic], on_assign=cb("assign"), on_revoke=cb("revoke"), on_lost=cb("lost"))

    a = make(config("a"))
    subscribe(a, "a")
    _poll_until(lambda: len(a.assignment()) == 4, a)
    for _ in range(3):
        a.consume(10, 0.1)
    positions = [p.offset for p in a.position(a.assignment())]
    log.append(("a", "position before any record", positions))
    result = a.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    log.append(("a", "sync commit returned", [p.partition for p in result]))
    a.consume(10, 0.2)
    log.append(("a", "on_commit calls after a sync commit", len(commits)))
    a.commit(offsets=[TopicPartition(topic, 1, 0)], asynchronous=True)
    log.append(("a", "on_commit calls right after an async commit", len(commits)))
    _poll_until(lambda: len(commits) == 1, a, timeout=5)
    log.append(("a", "on_commit result", (commits[0][0], commits[0][1])))

    b = make(config("b"))
    subscribe(b, "b")
    _poll_until(lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2, a, b)
    for _ in range(5):  # let any trailing callbacks of the rebalance arrive
        a.consume(10, 0.1)
        b.consume(10, 0.1)
    log.append(("-", "close a", None))
    a.close()
    _poll_until(lambda: len(b.assignment()) == 4, b)
    b.close()
    return log


def _shape(log: Log, strategy: str) -> dict[str, Any]:
    """What the application can rely on, independent of which partitions moved."""
    closed = log.index(("-", "close a", None))
    before, after = log[:closed], log[closed:]
    rebalance = [e for e in before if e[1] in ("assign", "revoke", "lost")][1:]
    a_first = next(e for e in before if e[1] == "assign")
    revoked = [e[2] for e in rebalance if e[0] == "a" and e[1] == "revoke"]
    b_given = [e[2] for e in rebalance if e[0] == "b" and e[1] == "assign" and e[2]]
    shape: dict[str, Any] = {
        "commits": [e for e in before if "commit" in e[1]],
        "positions": [e for e in before if "position" in e[1]],
        "first assignment": a_first,
        "revokes of a": [len(r) for r in revoked],
        "empty revokes": [e for e in log if e[1] == "revoke" and not e[2]],
        "b got": [len(p) for p in b_given],
        "close": [(e[0], e[1], len(e[2])) for e in after if e[1] in ("assign", "revoke")],
    }
    # A partition reaches b only after a's on_revoke for it returned.
    first_b = next(i for i, e in enumerate(rebalance) if e[0] == "b" and e[2])
    first_revoke = next(i for i, e in enumerate(rebalance) if e[1] == "revoke")
    shape["revoke before reassignment"] = first_revoke < first_b
    if strategy == "cooperative-sticky":
        shape["a kept"] = 4 - len(revoked[0])
        shape["a told of the new generation"] = any(
            e[0] == "a" and e[1] == "assign" and not e[2] for e in rebalance
        )
        moved = sorted(p for given in b_given for p in given)
        shape["b got what a gave up"] = moved == sorted(revoked[0])
    return shape


@pytest.mark.parametrize("strategy", ["cooperative-sticky", "range"])
def test_memory_broker_matches_kafka(kafka_broker: KafkaBroker, strategy: str) -> None:
    real_topic = f"parity-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(real_topic, 4)
    bootstrap = kafka_broker.bootstrap
    real = _scenario(
        lambda conf: Consumer({"bootstrap.servers": bootstrap, **conf}), real_topic, strategy
    )

    memory = MemoryBroker()
    memory.create_topic("parity", 4)
    fake = _scenario(lambda conf: memory.clients().consumer(conf), "parity", strategy)

    assert _shape(fake, strategy) == _shape(real, strategy), (real, fake)
