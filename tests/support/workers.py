"""Run real worker processes against the test broker, and look at what they did."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from offtake_testbed.kafka import read_topic

REPO = Path(__file__).resolve().parents[2]


def manifest(
    name: str,
    bootstrap: str,
    topics: list[str],
    *,
    sink: dict[str, Any],
    group: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": name, "namespace": "test"},
        "spec": {
            "kafka": {
                "bootstrapServers": bootstrap,
                "config": {"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"},
            },
            "source": {"topics": topics, "groupId": group or f"g-{uuid.uuid4().hex[:8]}"},
            "sink": sink,
            "commit": {"intervalSeconds": 0.5},
            "shutdown": {"drainTimeoutSeconds": 10},
        },
    }
    for key, value in spec.items():
        doc["spec"][key] = value
    return doc


def write_manifest(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


@dataclass
class WorkerProcess:
    """``offtake worker`` as a child process, the way a pod runs it."""

    manifest: Path
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        env = {
            **os.environ,
            "PYTHONPATH": f"{REPO / 'tests'}{os.pathsep}{REPO / 'examples'}",
            **self.env,
        }
        self._out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "offtake.cli",
                "worker",
                "--pipeline",
                str(self.manifest),
                "--metrics-port",
                "0",
            ],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def terminate(self, timeout: float = 60) -> int:
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> int:
        self.signal(signal.SIGKILL)
        return self.wait(10)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        finally:
            self._out.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_until(
        self, condition: Callable[[], bool], what: str, timeout: float = 180, every: float = 0.02
    ) -> None:
        """Poll ``condition`` every ``every`` seconds; fail (with the worker's log) if the
        worker exits or time runs out."""
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"the worker exited before {what}:\n{self.output()[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {timeout}s:\n{self.output()[-4000:]}")
            time.sleep(every)


def produce(
    bootstrap: str, topic: str, values: Iterable[dict[str, Any] | bytes], key_of: str = "id"
) -> int:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    n = 0
    for v in values:
        if isinstance(v, bytes):
            p.produce(topic, v, key=str(n).encode())
        else:
            p.produce(topic, json.dumps(v).encode(), key=str(v.get(key_of, n)).encode())
        n += 1
        if n % 10_000 == 0:
            p.poll(0)
    assert p.flush(30) == 0, "test producer could not deliver"
    return n


def read_all(bootstrap: str, topic: str) -> list[Any]:
    """Every record of ``topic`` up to its current log end (the test bed's reader)."""
    return read_topic(bootstrap, topic)


def ids_of(messages: list[Any]) -> Counter[int]:
    return Counter(json.loads(m.value())["id"] for m in messages)


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        c.close()


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets (-1001 where none).

    Read with a consumer's OffsetFetch, not AdminClient.list_consumer_group_offsets: with
    confluent-kafka 2.16.1 the latter crashed the process inside librdkafka
    (rd_kafka_handle_OffsetFetch -> rd_kafka_cgrp_op) in this test bed.
    """
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
                return {tp.partition: tp.offset for tp in got}
            except KafkaException as exc:
                # Right after the broker starts, the offsets topic may still be loading.
                if time.monotonic() > deadline or (
                    not exc.args[0].retriable()
                    and exc.args[0].code()
                    not in (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
                ):
                    raise
                time.sleep(0.5)
    finally:
        c.close()


def committed_records(bootstrap: str, group: str, topic: str, partitions: int) -> int:
    """How many records the group has committed over all partitions (0 where none)."""
    return sum(max(0, o) for o in committed(bootstrap, group, topic, partitions).values())


def wait_caught_up(
    bootstrap: str, group: str, topic: str, partitions: int, timeout: float = 120
) -> dict[int, int]:
    """Wait until the group's committed offsets reach the log end of every partition."""
    deadline = time.monotonic() + timeout
    ends = end_offsets(bootstrap, topic, partitions)
    while True:
        got = committed(bootstrap, group, topic, partitions)
        if all(got.get(p, -1) >= ends[p] for p in ends):
            return got
        if time.monotonic() > deadline:
            lag = {p: ends[p] - max(got.get(p, 0), 0) for p in ends}
            raise AssertionError(f"group {group} did not catch up within {timeout}s; lag {lag}")
        time.sleep(0.5)
