"""What every chaos scenario shares: the :class:`Outcome` row, the Kafka it runs on, topics
and pipelines, a producer spread over time, and the samplers that watch a group's progress and
a process's memory."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Self

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from offtake_testbed.kafka import read_topic

from ..reports import lost_and_duplicated
from ..workers import WorkerProcess, ids_of, manifest, write_manifest

_log = logging.getLogger("chaos")


class Bed(Protocol):
    """What a scenario needs of Kafka: a single broker or the three-broker cluster."""

    @property
    def bootstrap(self) -> str: ...

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: Mapping[str, str] | None = None,
        timeout: float = 60.0,
    ) -> None: ...


@dataclass
class Outcome:
    scenario: str
    records: int
    faults: str
    fault_count: int
    lost: int
    duplicated: int
    duplicate_bound: int
    recover_seconds: float
    peak_rss_mib: float | None = None
    notes: list[str] = field(default_factory=list)

    def check(self) -> None:
        assert self.lost == 0, f"{self.scenario}: {self.lost} records lost ({self.notes})"
        assert self.duplicated <= self.duplicate_bound, (
            f"{self.scenario}: {self.duplicated} duplicates > bound {self.duplicate_bound}"
        )


def new_topic(bed: Bed, stem: str, partitions: int, config: Mapping[str, str] | None = None) -> str:
    name = f"chaos-{stem}-{uuid.uuid4().hex[:8]}"
    bed.create_topic(name, partitions, config)
    return name


class Sampler:
    """Calls ``sample`` every ``every`` seconds on a thread of its own, from ``with`` to its
    end (then ``close``)."""

    every = 0.5

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def sample(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release what sampling used."""


class ProgressMonitor(Sampler):
    """Samples the group's committed total every half second (errors while brokers are
    down are skipped), so recovery after each fault can be measured from the samples."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int) -> None:
        super().__init__()
        # One consumer that only reads the group's offsets (never joins it); its connection
        # errors while brokers are down go to logging, not to the terminal.
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "logger": logging.getLogger("chaos.monitor"),
            }
        )
        self._partitions = [TopicPartition(topic, p) for p in range(partitions)]
        self.samples: list[tuple[float, int]] = []

    def sample(self) -> None:
        with contextlib.suppress(KafkaException):
            got = self._consumer.committed(self._partitions, timeout=5)
            self.samples.append((time.monotonic(), sum(max(0, tp.offset) for tp in got)))

    def close(self) -> None:
        self._consumer.close()

    def latest(self) -> int:
        return self.samples[-1][1] if self.samples else 0

    def wait_for(self, done: int, timeout: float, alive: Callable[[], None]) -> float:
        """Wait until ``done`` records are committed; return the time it took."""
        began = time.monotonic()
        while self.latest() < done:
            alive()
            if time.monotonic() - began > timeout:
                raise AssertionError(
                    f"group committed {self.latest()} of {done} records within {timeout:.0f}s"
                )
            time.sleep(0.25)
        return time.monotonic() - began

    def recovery(self, fault_at: float, total: int) -> float:
        """Seconds from ``fault_at`` until the committed total moved past its value then."""
        before = [n for t, n in self.samples if t <= fault_at]
        base = before[-1] if before else 0
        if base >= total:
            return 0.0
        for t, n in self.samples:
            if t > fault_at and n > base:
                return t - fault_at
        return float("inf")


def start_producing(
    bootstrap: str, topic: str, records: int, seconds: float, *, size: int = 0
) -> threading.Thread:
    """Produce ids 0..records-1 (JSON, key = id) spread over about ``seconds``, in a thread.
    The producer outlasts broker restarts: idempotent, acks=all, retries for ten minutes."""

    def run() -> None:
        p = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 20,
                "enable.idempotence": True,
                "message.timeout.ms": 600_000,
                "logger": _log,
            }
        )
        pad = "x" * size
        chunks = max(1, int(seconds / 0.5))
        per = -(-records // chunks)
        began = time.monotonic()
        for c in range(chunks):
            for i in range(c * per, min(records, (c + 1) * per)):
                value = {"id": i, "pad": pad} if size else {"id": i}
                while True:
                    try:
                        p.produce(topic, json.dumps(value).encode(), key=str(i).encode())
                        break
                    except BufferError:
                        p.poll(0.1)
                if i % 5000 == 0:
                    p.poll(0)
            delay = began + (c + 1) * seconds / chunks - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        left = p.flush(600)
        assert left == 0, f"the test producer could not deliver {left} records"

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def count_output(bootstrap: str, topic: str, records: int) -> tuple[int, int]:
    counts = ids_of(read_topic(bootstrap, topic, timeout=300))
    return lost_and_duplicated(records, counts)


def copy_pipeline(
    bed: Bed, workdir: Path, name: str, partitions: int, **spec: Any
) -> tuple[str, str, Path, str]:
    """Topics ``chaos-<name>-in`` and ``-out`` of ``partitions`` partitions and a pipeline
    ``name`` copying the first to the second: (input, output, manifest path, group)."""
    src, out = new_topic(bed, f"{name}-in", partitions), new_topic(bed, f"{name}-out", partitions)
    group = f"chaos-{name}-{uuid.uuid4().hex[:8]}"
    doc = manifest(name, bed.bootstrap, [src], sink={"kafka": {"topic": out}}, group=group, **spec)
    return src, out, write_manifest(workdir / f"{name}.yaml", doc), group


class CopyUnderFaults:
    """Scenarios 1 and 2's run: ``workers`` workers copying ``records`` records, produced over
    about ``seconds``, through a :func:`copy_pipeline` (limits.maxInFlightMessages
    ``max_in_flight``), watched by a :class:`ProgressMonitor`, while the ``with`` block
    injects faults; :meth:`finish` waits for every record and stops the workers. Workers
    still running when the block ends are killed."""

    def __init__(
        self,
        bed: Bed,
        workdir: Path,
        name: str,
        *,
        partitions: int,
        records: int,
        seconds: float,
        workers: int,
        max_in_flight: int,
    ) -> None:
        self.bed, self.workdir, self.name, self.records = bed, workdir, name, records
        self.partitions, self._seconds, self._count = partitions, seconds, workers
        limits = {"maxInFlightMessages": max_in_flight}
        self.src, self.out, self.path, self.group = copy_pipeline(
            bed, workdir, name, partitions, limits=limits
        )
        self.workers: list[WorkerProcess] = []
        self.alive = all_alive(self.workers)

    def start_worker(self, label: str) -> WorkerProcess:
        return WorkerProcess(self.path, self.workdir / f"{self.name}-{label}.log").start()

    def __enter__(self) -> Self:
        bootstrap = self.bed.bootstrap
        self._producer = start_producing(bootstrap, self.src, self.records, self._seconds)
        with contextlib.ExitStack() as stack:
            stack.enter_context(running(self.workers))
            self.workers.extend(self.start_worker(f"w{i}") for i in range(self._count))
            self.monitor = stack.enter_context(
                ProgressMonitor(bootstrap, self.group, self.src, self.partitions)
            )
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def finish(self, faults: list[float]) -> tuple[float, int, int]:
        """Wait for every record to be produced and committed, stop the workers (each must
        exit 0), count the output: (the longest recovery after a fault, lost, duplicated)."""
        self._producer.join(600)
        self.monitor.wait_for(self.records, 600, self.alive)
        recover = max((self.monitor.recovery(t, self.records) for t in faults), default=0.0)
        codes = [w.terminate() for w in self.workers]
        assert codes == [0] * len(self.workers), codes
        return recover, *count_output(self.bed.bootstrap, self.out, self.records)


def all_alive(workers: list[WorkerProcess]) -> Callable[[], None]:
    def check() -> None:
        for w in workers:
            assert w.proc is not None
            if w.proc.poll() is not None:
                raise AssertionError(
                    f"a worker exited ({w.proc.returncode}):\n{w.output()[-3000:]}"
                )

    return check


@contextmanager
def running(workers: list[WorkerProcess]) -> Iterator[list[WorkerProcess]]:
    try:
        yield workers
    finally:
        for w in workers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.kill()
                w.wait(10)


def rss_mib(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of a process in MiB, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024
