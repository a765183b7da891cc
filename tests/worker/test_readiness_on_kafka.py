"""/readyz of a real worker process: 503 before its first assignment, while a revoke's drain
holds the poll loop, and while it drains on shutdown; 200 otherwise."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.workers import WorkerProcess, manifest, produce, write_manifest

from offtake_testbed.kafka import KafkaBroker

pytestmark = pytest.mark.kafka


def readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def watch(
    port: int, until: Callable[[list[tuple[int, str]]], bool], timeout: float
) -> list[tuple[int, str]]:
    """Probe every 0.2 s until ``until(seen)``; returns every answer, in order."""
    seen: list[tuple[int, str]] = []
    deadline = time.monotonic() + timeout
    while not until(seen):
        assert time.monotonic() < deadline, f"/readyz answers so far: {seen[-5:]}"
        try:
            seen.append(readyz(port))
        except OSError:  # the process has stopped serving
            seen.append((0, "gone"))
        time.sleep(0.2)
    return seen


# A group member that polls until it holds partitions, says so, then never polls again.
BLOCKER = """
import sys, time
from confluent_kafka import Consumer
bootstrap, group, topic = sys.argv[1:4]
consumer = Consumer({
    "bootstrap.servers": bootstrap, "group.id": group,
    "partition.assignment.strategy": "range",
    "max.poll.interval.ms": 8000, "session.timeout.ms": 6000,
})
consumer.subscribe([topic])
deadline = time.monotonic() + 30
while not consumer.assignment() and time.monotonic() < deadline:
    consumer.poll(0.1)
print("assigned" if consumer.assignment() else "none", flush=True)
time.sleep(3600)
"""


def test_not_ready_before_the_first_assignment(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src = topic_factory(2)
    doc = manifest("ready-start", kafka_broker.bootstrap, [src], sink={"log": {}})
    doc["spec"]["kafka"]["groupProtocol"] = "range"
    group = doc["spec"]["source"]["groupId"]
    # A member that stops polling holds up the group's next (eager) rebalance until its
    # max.poll.interval.ms: the worker's first assignment waits that long. The member lives in
    # a process of its own that is killed at the end: a Consumer.close() here, after
    # librdkafka has made the idle member leave the group, hung a CI run for ten minutes.
    blocker = subprocess.Popen(
        [sys.executable, "-c", BLOCKER, kafka_broker.bootstrap, group, src],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert blocker.stdout is not None
        line = blocker.stdout.readline()  # the member prints once it holds partitions
        assert line.strip() == "assigned", f"the blocking member got no partitions: {line!r}"
        worker = WorkerProcess(write_manifest(tmp_path / "p.yaml", doc), tmp_path / "w.log").start()
        port = worker.metrics_port()
        seen = watch(port, lambda s: bool(s) and s[-1][0] == 200, timeout=60)
        assert seen[0][0] == 503 and "no stable partition assignment yet" in seen[0][1], seen[:3]
        assert sum(1 for code, _ in seen if code == 503) >= 5, seen  # a second or more
        assert worker.terminate() == 0, worker.output()[-2000:]
    finally:
        blocker.kill()
        blocker.wait()


def test_not_ready_while_a_revoke_drain_holds_the_poll_loop(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src = topic_factory(2)
    doc = manifest(
        "ready-stall",
        kafka_broker.bootstrap,
        [src],
        sink={"log": {}},
        processor={"function": "support.processors:slow"},
        shutdown={"drainTimeoutSeconds": 20},
    )
    path = write_manifest(tmp_path / "p.yaml", doc)
    produce(kafka_broker.bootstrap, src, ({"id": i} for i in range(400)))
    env = {"OFFTAKE_TEST_SLOW_SECONDS": "0.25"}  # a chunk of 100 records takes 25 s
    first = WorkerProcess(path, tmp_path / "w1.log", env=env).start()
    port = first.metrics_port()
    watch(port, lambda s: bool(s) and s[-1][0] == 200, timeout=60)
    second = WorkerProcess(path, tmp_path / "w2.log", env=env).start()  # first must revoke one
    seen = watch(port, lambda s: any("stalled" in body for _, body in s), timeout=60)
    assert seen[-1][0] == 503 and "poll loop stalled" in seen[-1][1]
    # Once the drain budget is spent the loop polls again, and the worker is ready again.
    watch(port, lambda s: bool(s) and s[-1][0] == 200, timeout=60)
    assert [w.terminate(timeout=90) for w in (second, first)] == [0, 0]


def test_not_ready_while_draining_on_shutdown(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src = topic_factory(1)
    doc = manifest(
        "ready-stop",
        kafka_broker.bootstrap,
        [src],
        sink={"log": {}},
        processor={"function": "support.processors:slow"},
        shutdown={"drainTimeoutSeconds": 5},
    )
    produce(kafka_broker.bootstrap, src, ({"id": i} for i in range(200)))
    worker = WorkerProcess(
        write_manifest(tmp_path / "p.yaml", doc),
        tmp_path / "w.log",
        env={"OFFTAKE_TEST_SLOW_SECONDS": "0.1"},
    ).start()
    port = worker.metrics_port()
    watch(port, lambda s: bool(s) and s[-1][0] == 200, timeout=60)
    worker.signal(signal.SIGTERM)
    seen = watch(port, lambda s: bool(s) and s[-1][0] != 200, timeout=10)
    assert seen[-1] == (503, seen[-1][1]) and "shutting down" in seen[-1][1], seen[-3:]
    assert worker.wait(30) == 0, worker.output()[-2000:]
