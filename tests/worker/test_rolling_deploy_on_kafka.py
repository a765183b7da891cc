"""A Deployment's rolling update, played with real worker processes on the real broker.

Three workers share a 12-partition topic under a steady produce rate; each is replaced the way
a rolling update replaces pods (the new one starts, then the old one gets SIGTERM), twice over.
At-least-once must then lose and duplicate nothing (every revoke drains and commits before it
lets go), and an observer polling the group's description measures how long each partition
had no owner around each replacement.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from support.reports import lost_and_duplicated, report
from support.workers import (
    SteadyFlow,
    WorkerProcess,
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
    wait_owned(watch)
    flow = SteadyFlow(kafka_broker.bootstrap, src, RATE // 10, 0.1).start()  # RATE a second
    watch.start()
    windows: list[float] = []
    try:
        for n in range(6):  # each of the three replaced, twice over
            time.sleep(2)
            watch.reset()
            new = WorkerProcess(path, tmp_path / f"w{n + 3}.log").start()
            time.sleep(3)  # the new pod is up and has joined
            old = workers.pop(0)
            assert old.terminate() == 0, old.output()[-2000:]
            workers.append(new)
            wait_owned(watch)
            time.sleep(1)
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
