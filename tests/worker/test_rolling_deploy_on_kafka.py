"""A Deployment's rolling update, played with real worker processes on the real broker.

Three workers share a 12-partition topic under a steady produce rate; each is replaced the way
a rolling update replaces pods (the new one starts, then the old one gets SIGTERM), twice over.
At-least-once must then lose and duplicate nothing (every revoke drains and commits before it
lets go), and an observer polling the group's description measures how long each partition
had no owner around each replacement.

What made that test duplicate under load, a SIGTERM while the worker's rejoin waits at the
coordinator, is then made certain with a member slow to rejoin: the worker's final commit is
refused until the rebalance is over, and must be retried rather than given up (docs/worker.md,
"A stop during a rebalance").
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from support.reports import lost_and_duplicated, report
from support.workers import (
    SteadyFlow,
    WorkerProcess,
    committed,
    ids_of,
    manifest,
    read_all,
    wait_caught_up,
    write_manifest,
)

from offtake_testbed.kafka import KafkaBroker

pytestmark = pytest.mark.kafka

PARTITIONS = 12
RATE = 1_000  # records per second, steady
SAMPLE = 0.05  # seconds between looks at the group


class OwnershipWatch:
    """Samples which partitions the group's members own; sums each partition's unowned time."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.group, self.topic = group, topic
        self.unowned: dict[int, float] = dict.fromkeys(range(PARTITIONS), 0.0)
        #: Looks taken so far (read by the test's thread: a window is read after a look).
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> OwnershipWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def reset(self) -> None:
        self.unowned = dict.fromkeys(range(PARTITIONS), 0.0)

    def window(self) -> float:
        """The longest any partition went unowned since the last reset."""
        return max(self.unowned.values())

    def owned(self) -> set[int]:
        futures = self.admin.describe_consumer_groups([self.group], request_timeout=5)
        description = futures[self.group].result()
        return {
            tp.partition
            for m in description.members
            for tp in (m.assignment.topic_partitions if m.assignment else [])
            if tp.topic == self.topic
        }

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            try:
                owned = self.owned()
            except Exception:  # the coordinator is busy rebalancing: count it as unowned
                owned = set()
            now = time.monotonic()
            for p in range(PARTITIONS):
                if p not in owned:
                    self.unowned[p] += now - last
            last = now
            self.samples += 1
            self._stop.wait(SAMPLE)

    def wait_looked(self, looks: int = 2, timeout: float = 60) -> None:
        """Wait until the watch has taken ``looks`` more looks: with two, one began after
        this call, so the window counts everything up to now."""
        target = self.samples + looks
        deadline = time.monotonic() + timeout
        while self.samples < target:
            assert self._thread.is_alive(), "the ownership watch stopped"
            assert time.monotonic() < deadline, "the ownership watch took no look"
            self._stop.wait(SAMPLE)


def wait_owned(watch: OwnershipWatch, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while watch.owned() != set(range(PARTITIONS)):
        assert time.monotonic() < deadline, "the group never owned every partition"
        time.sleep(0.1)


@pytest.mark.parametrize("protocol", ["cooperative-sticky", "consumer", "range"])
def test_rolling_replacements_lose_and_duplicate_nothing(
    protocol: str, kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src, out = topic_factory(PARTITIONS), topic_factory(PARTITIONS)
    doc = manifest("rolling", kafka_broker.bootstrap, [src], sink={"kafka": {"topic": out}})
    doc["spec"]["kafka"]["groupProtocol"] = protocol
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    group = doc["spec"]["source"]["groupId"]
    workers = [WorkerProcess(path, tmp_path / f"w{i}.log").start() for i in range(3)]
    watch = OwnershipWatch(kafka_broker.bootstrap, group, src)
    where = (kafka_broker.bootstrap, group, src, PARTITIONS)
    wait_owned(watch)
    flow = SteadyFlow(kafka_broker.bootstrap, src, RATE // 10, 0.1).start()  # RATE a second
    watch.start()
    windows: list[float] = []
    try:
        for n in range(6):  # each of the three replaced, twice over
            # Steady before each replacement: the group has committed what was produced
            # up to now (at least one record), so records flow through the current members.
            mark = max(flow.produced, 1)
            workers[-1].wait_until(
                lambda m=mark: sum(max(0, o) for o in committed(*where).values()) >= m,
                f"the group's commits past record {mark}",
                every=0.2,
            )
            watch.reset()
            new = WorkerProcess(path, tmp_path / f"w{n + 3}.log").start()
            # The new pod is up and has joined: it owns partitions.
            new.wait_until(lambda w=new: w.metric("offtake_assigned_partitions") > 0, "partitions")
            old = workers.pop(0)
            assert old.terminate() == 0, old.output()[-2000:]
            workers.append(new)
            wait_owned(watch)
            watch.wait_looked()
            windows.append(round(watch.window(), 2))
    finally:
        total = flow.stop()
        watch.stop()
    wait_caught_up(kafka_broker.bootstrap, group, src, PARTITIONS, timeout=120)
    codes = [w.terminate() for w in workers]
    assert codes == [0, 0, 0], [w.output()[-2000:] for w in workers]
    counts = ids_of(read_all(kafka_broker.bootstrap, out))
    lost, duplicated = lost_and_duplicated(total, counts)
    report(
        f"rolling-{protocol}",
        produced=total,
        lost=lost,
        duplicated=duplicated,
        unowned_seconds_per_replacement=windows,
    )
    assert (lost, duplicated) == (0, 0)


SLOW_REJOIN = 8.0  # seconds the slow member spends in its first assign callback


class SlowMember:
    """A plain consumer of the group whose first assign callback takes ``SLOW_REJOIN``
    seconds: its rejoin waits for the callback, and so does the rebalance that every other
    member's rejoin parks in. Polled on its own thread; it commits nothing."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "partition.assignment.strategy": "cooperative-sticky",
                "enable.auto.commit": False,
                "session.timeout.ms": 30_000,
                "heartbeat.interval.ms": 500,
            }
        )
        self.topic = topic
        self.slowing = threading.Event()  # the callback is under way
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slow-member", daemon=True)

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        if not self.slowing.is_set():
            self.slowing.set()
            self._stop.wait(SLOW_REJOIN)
        consumer.incremental_assign(partitions)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        consumer.incremental_unassign(partitions)

    def _run(self) -> None:
        self.consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
        while not self._stop.is_set():
            self.consumer.consume(100, 0.1)
        # Leave outside close(): see support.brokers._close_quietly (librdkafka #4041).
        self.consumer.unsubscribe()
        deadline = time.monotonic() + 5
        while self.consumer.assignment() and time.monotonic() < deadline:
            self.consumer.consume(100, 0.05)
        self.consumer.close()

    def start(self) -> SlowMember:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


def produce_to_each(bootstrap: str, topic: str, first: int, per_partition: int) -> None:
    """``per_partition`` records ``{"id": p * 1000 + n}`` to each partition p, n from ``first``."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for p in range(PARTITIONS):
        for n in range(first, first + per_partition):
            producer.produce(topic, json.dumps({"id": p * 1000 + n}).encode(), partition=p)
    assert producer.flush(30) == 0


def wait_delivered(bootstrap: str, topic: str, n: int, deadline: float) -> None:
    while len(read_all(bootstrap, topic)) < n:
        assert time.monotonic() < deadline, f"fewer than {n} records reached {topic} in time"
        time.sleep(0.1)


def test_a_stop_while_a_rebalance_waits_commits_what_was_delivered(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    """SIGTERM while the worker's rejoin is parked at the coordinator: the last commit lands.

    The rolling test's duplicates, made certain. A member slow to rejoin keeps the group's
    rebalance open; the worker, having given up half its partitions, has rejoined and its
    JoinGroup waits at the coordinator. The broker answers one connection's requests in order,
    so the worker's final commit is answered only after the join: ILLEGAL_GENERATION, then
    REBALANCE_IN_PROGRESS until the leader's SyncGroup. The worker must retry until the
    commit lands instead of letting go: every record it delivered is committed (the next
    owner starts past them), and it still exits 0.
    """
    src, out = topic_factory(PARTITIONS), topic_factory(PARTITIONS)
    doc = manifest("in-rebalance", kafka_broker.bootstrap, [src], sink={"kafka": {"topic": out}})
    doc["spec"]["commit"] = {"intervalSeconds": 60}  # only revoke and shutdown commit
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    group = doc["spec"]["source"]["groupId"]
    worker = WorkerProcess(path, tmp_path / "worker.log").start()
    wait_owned(OwnershipWatch(kafka_broker.bootstrap, group, src))
    produce_to_each(kafka_broker.bootstrap, src, 0, 10)
    wait_delivered(kafka_broker.bootstrap, out, 10 * PARTITIONS, time.monotonic() + 30)
    slow = SlowMember(kafka_broker.bootstrap, group, src).start()
    kept = PARTITIONS // 2  # cooperative-sticky, two members
    try:
        assert slow.slowing.wait(60), "the slow member never joined"
        window_ends = time.monotonic() + SLOW_REJOIN
        # The worker gives up half its partitions, then rejoins: its JoinGroup waits.
        revoked = f"revoked {PARTITIONS - kept} partition(s)"
        worker.wait_until(lambda: revoked in worker.output(), "its revoke", SLOW_REJOIN / 2)
        produce_to_each(kafka_broker.bootstrap, src, 10, 10)
        wait_delivered(kafka_broker.bootstrap, out, 10 * (PARTITIONS + kept), window_ends - 2)
        worker.signal(signal.SIGTERM)  # while its rejoin waits for the slow member
        code = worker.wait(60)
    finally:
        slow.stop()
        if worker.proc is not None and worker.proc.poll() is None:  # failed before the stop
            worker.kill()
    assert code == 0, worker.output()[-3000:]
    outputs = read_all(kafka_broker.bootstrap, out)
    delivered = Counter(json.loads(m.value())["id"] // 1000 for m in outputs)
    assert sorted(delivered.values()) == [10] * (PARTITIONS - kept) + [20] * kept, delivered
    offsets = committed(kafka_broker.bootstrap, group, src, PARTITIONS)
    assert offsets == {p: delivered[p] for p in range(PARTITIONS)}, worker.output()[-3000:]
