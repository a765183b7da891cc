"""Run real worker processes against the test broker, and look at what they did."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from offtake.engine.worker import Worker
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


#: An exactly-once sink's settings in the tests: a killed worker's open transaction is aborted
#: by the broker after this long (its successor has another transactional.id when it is
#: another process). Short, so that read_committed readers are not held up for librdkafka's
#: default minute.
EXACTLY_ONCE_SINK_CONFIG = {"transaction.timeout.ms": "10000"}


def exactly_once_manifest(
    name: str, bootstrap: str, src: str, out: str, **spec: Any
) -> dict[str, Any]:
    """A pipeline copying ``src`` to the topic ``out`` with sink.kafka.delivery exactly-once."""
    sink = {
        "kafka": {
            "topic": out,
            "delivery": "exactly-once",
            "config": dict(EXACTLY_ONCE_SINK_CONFIG),
        }
    }
    # A transaction ends only once everything handed out is settled, within the drain budget
    # (else it aborts and the worker exits 3): generous, for a loaded test machine.
    spec.setdefault("shutdown", {"drainTimeoutSeconds": 30})
    return manifest(name, bootstrap, [src], sink=sink, **spec)


def queue_manifest(name: str, bootstrap: str, src: str, out: str, **spec: Any) -> dict[str, Any]:
    """A pipeline copying ``src`` to the topic ``out`` in queue mode (source.groupType share)."""
    doc = manifest(name, bootstrap, [src], sink={"kafka": {"topic": out}}, **spec)
    doc["spec"]["source"]["groupType"] = "share"
    # A share consumer takes no session or heartbeat settings (the broker's group has them).
    doc["spec"]["kafka"]["config"] = {}
    return doc


def dead_lettering(dlq: str, *, retries: int, backoff: float | None) -> dict[str, Any]:
    """spec.errors: ``retries`` retries ``backoff`` seconds apart, then the topic ``dlq``."""
    errors: dict[str, Any] = {"policy": "dlq", "maxRetries": retries, "dlq": {"topic": dlq}}
    if backoff is not None:
        errors["retryBackoffSeconds"] = backoff
    return errors


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
            # This checkout's worker first: the venv's editable install may point at another
            # (a git worktree), and the worker must run the code under test.
            "PYTHONPATH": os.pathsep.join(str(REPO / d) for d in ("worker", "tests", "examples")),
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
        """SIGTERM, the graceful stop, and the exit code. Sent once the worker takes it: a
        worker started a moment ago may still be starting its interpreter, before offtake.cli
        installs its handlers, and then SIGTERM's default action kills it (-15)."""
        self.wait_until_handles_sigterm(timeout)
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait_until_handles_sigterm(self, timeout: float = 30) -> float:
        """Seconds until the process has a SIGTERM handler in place (or has exited)."""
        assert self.proc is not None
        started = time.monotonic()
        while self.proc.poll() is None and not handles_sigterm(self.proc.pid):
            assert time.monotonic() - started < timeout, "no SIGTERM handler installed"
            time.sleep(0.002)  # a poll of /proc: the handler comes within the interpreter's start
        return time.monotonic() - started

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

    def metrics_port(self, timeout: float = 60) -> int:
        """The port of /metrics, /healthz and /readyz, once the worker's log names it."""
        self.wait_until(lambda: served_port(self.output()) is not None, "its port", timeout)
        port = served_port(self.output())
        assert port is not None
        return port

    def metric(self, name: str, **labels: str) -> float:
        """The worker's /metrics series ``name`` (the exported name: ``_total`` on counters)
        with these labels, summed over its other labels; 0 where it has none. What a test waits
        on to know the worker got somewhere (consumed, assigned, acknowledged), not a sleep."""
        url = f"http://127.0.0.1:{self.metrics_port()}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )

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


#: The worker's log line naming the port it serves /metrics, /healthz and /readyz on (cli.py).
METRICS_PORT_LINE = re.compile(r"/readyz on port (\d+)")


def handles_sigterm(pid: int) -> bool:
    """Whether the process has installed a SIGTERM handler (its SigCgt mask says so)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def served_port(output: str) -> int | None:
    """The metrics port a worker's log says it serves on (None: not said yet)."""
    found = METRICS_PORT_LINE.search(output)
    return None if found is None else int(found.group(1))


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


class SteadyFlow:
    """Records ``{"id": n}`` produced on a thread at a steady rate, the load under which
    rebalances, replacements and crashes are tested: ``per_tick`` records every ``tick``
    seconds, ids from 0 up, until ``total`` are out (when given) or :meth:`stop`.

    ``with SteadyFlow(...) as flow:`` starts it and stops it; :meth:`join` waits for ``total``.
    A failed send fails the test at :meth:`join` or :meth:`stop`, not silently on its thread.
    """

    def __init__(
        self, bootstrap: str, topic: str, per_tick: int, tick: float, total: int | None = None
    ) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.per_tick, self.tick, self.total = per_tick, tick, total
        #: Records sent so far (all of them acknowledged by the broker).
        self.produced = 0
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="steady-flow", daemon=True)

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                n = self.produced
                count = self.per_tick if self.total is None else min(self.per_tick, self.total - n)
                if count <= 0:
                    return
                produce(self.bootstrap, self.topic, ({"id": i} for i in range(n, n + count)))
                self.produced = n + count
                self._stopping.wait(self.tick)
        except BaseException as exc:  # handed to the test's thread by join()
            self._error = exc

    def start(self) -> SteadyFlow:
        self._thread.start()
        return self

    def join(self, timeout: float = 300.0) -> int:
        """Wait until the flow ended (``total`` sent, or stopped); the number of records sent."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the flow did not end within {timeout:g}s"
        if self._error is not None:
            raise AssertionError(f"the steady flow failed: {self._error!r}") from self._error
        return self.produced

    def stop(self) -> int:
        """Stop sending; the number of records sent."""
        self._stopping.set()
        return self.join()

    def __enter__(self) -> SteadyFlow:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running(worker: Worker, join_timeout: float = 60.0) -> Iterator[threading.Thread]:
    """An in-process ``worker`` running on a thread for the with block, stopped after it."""
    runner = threading.Thread(target=worker.run, name="worker-under-test")
    runner.start()
    try:
        yield runner
    finally:
        worker.stop()
        runner.join(join_timeout)
    assert not runner.is_alive(), f"the worker did not stop within {join_timeout:g}s"


def wait_committed(
    runner: threading.Thread,
    bootstrap: str,
    group: str,
    topic: str,
    partitions: int,
    total: int,
    timeout: float = 120.0,
    every: float = 0.5,
) -> None:
    """Wait until ``group`` committed ``total`` records of ``topic`` while ``runner`` (the
    worker's thread, from :func:`running`) is alive."""
    deadline = time.monotonic() + timeout
    while committed_records(bootstrap, group, topic, partitions) < total:
        assert time.monotonic() < deadline, "the worker did not commit every record"
        assert runner.is_alive(), "the worker stopped"
        time.sleep(every)


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


def group_state(bootstrap: str, group: str) -> ConsumerGroupState:
    """The consumer group's state as its coordinator describes it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.describe_consumer_groups([group], request_timeout=10)
    state: ConsumerGroupState = futures[group].result().state
    return state


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
