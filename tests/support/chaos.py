"""Chaos scenarios on real components, shared by the short tests (tests/chaos/) and the long
runs of ``bench/chaos.py``: the same body, only the sizes differ.

Each scenario returns a :class:`Outcome`: records, faults injected, records lost, records
duplicated, the longest time to recover after a fault, peak RSS where memory is the question,
and the duplicate bound it must stay within (faults times ``limits.maxInFlightMessages``: a
killed worker re-delivers at most its in-flight records). Callers assert ``lost == 0`` and
``duplicated <= duplicate_bound``; the bench writes them into docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Self

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from offtake_testbed.kafka import read_topic

from .cgroups import MemoryCgroup
from .manifest_corpus import one_replica
from .reports import lost_and_duplicated
from .workers import (
    REPO,
    WorkerProcess,
    end_offsets,
    ids_of,
    manifest,
    write_manifest,
)

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


def dead_lettering(dlq: str, *, retries: int, backoff: float | None) -> dict[str, Any]:
    """spec.errors: ``retries`` retries ``backoff`` seconds apart, then the topic ``dlq``."""
    errors: dict[str, Any] = {"policy": "dlq", "maxRetries": retries, "dlq": {"topic": dlq}}
    if backoff is not None:
        errors["retryBackoffSeconds"] = backoff
    return errors


def stop_process(proc: subprocess.Popen[bytes], grace: float = 30) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def new_topic(bed: Bed, stem: str, partitions: int, config: Mapping[str, str] | None = None) -> str:
    name = f"chaos-{stem}-{uuid.uuid4().hex[:8]}"
    bed.create_topic(name, partitions, config)
    return name


# -- watching a group's progress ---------------------------------------------------------------


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


def pipeline(
    bed: Bed, workdir: Path, name: str, src: str, out: str, partitions: int, **spec: Any
) -> tuple[Path, str]:
    group = f"chaos-{name}-{uuid.uuid4().hex[:8]}"
    doc = manifest(name, bed.bootstrap, [src], sink={"kafka": {"topic": out}}, group=group, **spec)
    return write_manifest(workdir / f"{name}.yaml", doc), group


def _all_alive(workers: list[WorkerProcess]) -> Callable[[], None]:
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


# -- 1. workers SIGKILLed at random ------------------------------------------------------------


def worker_kills(
    bed: Bed,
    workdir: Path,
    *,
    records: int,
    kills: int,
    every: float = 4.0,
    partitions: int = 6,
    max_in_flight: int = 2000,
    seed: int = 17,
) -> Outcome:
    """Three workers; every ``every`` seconds a random one is SIGKILLed and started again."""
    src, out = new_topic(bed, "kills-in", partitions), new_topic(bed, "kills-out", partitions)
    path, group = pipeline(
        bed, workdir, "kills", src, out, partitions, limits={"maxInFlightMessages": max_in_flight}
    )
    rng = random.Random(seed)
    producer = start_producing(bed.bootstrap, src, records, seconds=min(20.0, records / 20_000))
    workers = [WorkerProcess(path, workdir / f"kills-w{i}.log").start() for i in range(3)]
    faults: list[float] = []
    with running(workers), ProgressMonitor(bed.bootstrap, group, src, partitions) as monitor:
        for k in range(kills):
            time.sleep(every)
            victim = rng.randrange(3)
            workers[victim].kill()
            faults.append(time.monotonic())
            workers[victim] = WorkerProcess(path, workdir / f"kills-w{victim}-{k}.log").start()
        producer.join(600)
        monitor.wait_for(records, 600, _all_alive(workers))
        recover = max((monitor.recovery(t, records) for t in faults), default=0.0)
        codes = [w.terminate() for w in workers]
    assert codes == [0, 0, 0], codes
    lost, dup = count_output(bed.bootstrap, out, records)
    return Outcome(
        "1. three workers, a random one SIGKILLed and restarted",
        records,
        f"{kills} worker SIGKILLs, one every {every:g}s",
        kills,
        lost,
        dup,
        kills * max_in_flight,
        recover,
    )


# -- 2. brokers killed under the workers -------------------------------------------------------


class Cluster(Bed, Protocol):
    def leaders(self, topic: str) -> dict[int, int]: ...
    def kill_node(self, node_id: int) -> None: ...
    def start_node(self, node_id: int) -> None: ...
    def restart_all(self) -> None: ...
    def wait_until_serving(self, timeout: float = 120.0) -> None: ...
    def wait_fully_replicated(self, topic: str, timeout: float = 120.0) -> None: ...


def broker_failover(
    cluster: Cluster,
    workdir: Path,
    *,
    records: int,
    outage: float,
    full_restart: bool = True,
    partitions: int = 6,
    max_in_flight: int = 2000,
) -> Outcome:
    """Two workers on the three-broker cluster: the broker leading most partitions of the
    input is SIGKILLed mid-run and started again after ``outage`` seconds; then every broker
    restarts together. The workers must ride both out without being restarted."""
    src, out = (
        new_topic(cluster, "brokers-in", partitions),
        new_topic(cluster, "brokers-out", partitions),
    )
    path, group = pipeline(
        cluster,
        workdir,
        "brokers",
        src,
        out,
        partitions,
        limits={"maxInFlightMessages": max_in_flight},
    )
    producer = start_producing(cluster.bootstrap, src, records, seconds=max(10.0, records / 10_000))
    workers = [WorkerProcess(path, workdir / f"brokers-w{i}.log").start() for i in range(2)]
    alive = _all_alive(workers)
    notes = []
    with running(workers), ProgressMonitor(cluster.bootstrap, group, src, partitions) as monitor:
        monitor.wait_for(records // 5, 300, alive)
        leaders = list(cluster.leaders(src).values())
        victim = max(set(leaders), key=leaders.count)
        cluster.kill_node(victim)
        first = time.monotonic()
        time.sleep(outage)
        alive()
        cluster.start_node(victim)
        cluster.wait_until_serving()
        cluster.wait_fully_replicated(src)
        monitor.wait_for(min(records, monitor.latest() + records // 10), 300, alive)
        faults = [first]
        if full_restart:
            cluster.restart_all()
            faults.append(time.monotonic())
            cluster.wait_until_serving(180)
            notes.append(
                f"full restart: brokers serving again after {time.monotonic() - faults[-1]:.1f}s"
            )
        producer.join(600)
        monitor.wait_for(records, 600, alive)
        recover = max(monitor.recovery(t, records) for t in faults)
        codes = [w.terminate() for w in workers]
    assert codes == [0, 0], codes
    lost, dup = count_output(cluster.bootstrap, out, records)
    return Outcome(
        "2. three brokers (RF 3, min.insync 2): leaders' broker killed, then all restarted",
        records,
        f"leader broker SIGKILLed for {outage:g}s"
        + ("; all 3 brokers restarted together" if full_restart else ""),
        len(faults),
        lost,
        dup,
        len(faults) * 2 * max_in_flight,
        recover,
        notes=notes,
    )


# -- 3. the Kafka sink's broker unreachable ----------------------------------------------------


def rss_mib(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of a process in MiB, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def sink_broker_outage(
    bed: Bed,
    sink_bed: Bed,
    sink_pids: list[int],
    workdir: Path,
    *,
    records: int,
    outage: float,
    max_in_flight_bytes: int = 4 * 1024 * 1024,
    partitions: int = 3,
) -> Outcome:
    """Input on ``bed``, output on another broker whose JVM is frozen (SIGSTOP: it accepts no
    packet, every request times out, the way an unreachable host looks) for ``outage`` seconds.
    Backpressure must hold the worker's memory near ``limits.maxInFlightBytes``; nothing may
    be dead-lettered for the outage; the work resumes when the broker answers again."""
    src = new_topic(bed, "sinkout-in", partitions)
    out = new_topic(sink_bed, "sinkout-out", partitions)
    dlq = new_topic(bed, "sinkout-dlq", 1)
    group = f"chaos-sinkout-{uuid.uuid4().hex[:8]}"
    doc = manifest(
        "sinkout",
        bed.bootstrap,
        [src],
        sink={"kafka": {"topic": out, "config": {"bootstrap.servers": sink_bed.bootstrap}}},
        group=group,
        limits={"maxInFlightMessages": 1_000_000, "maxInFlightBytes": max_in_flight_bytes},
        errors=dead_lettering(dlq, retries=1, backoff=None),
    )
    path = write_manifest(workdir / "sinkout.yaml", doc)
    worker = WorkerProcess(path, workdir / "sinkout-w.log").start()
    alive = _all_alive([worker])
    assert worker.proc is not None
    pid = worker.proc.pid
    with running([worker]), ProgressMonitor(bed.bootstrap, group, src, partitions) as monitor:
        # A first tenth flows normally, so the baseline holds a warmed-up worker.
        start_producing(bed.bootstrap, src, records // 10, seconds=1, size=200).join(120)
        monitor.wait_for(records // 10, 180, alive)
        baseline, _ = rss_mib(pid)
        for sink_pid in sink_pids:
            os.kill(sink_pid, signal.SIGSTOP)
        fault_at = time.monotonic()
        try:
            rest = start_producing(
                bed.bootstrap, src, records, seconds=min(outage / 2, 20), size=200
            )
            rest.join(300)  # ids 0.. again: the second run's ids are what the check counts
            peak_during = 0.0
            while time.monotonic() - fault_at < outage:
                alive()
                peak_during = max(peak_during, rss_mib(pid)[0])
                time.sleep(0.5)
            stalled_at = monitor.latest()
        finally:
            for sink_pid in sink_pids:
                os.kill(sink_pid, signal.SIGCONT)
        resumed = time.monotonic()
        total = records + records // 10
        monitor.wait_for(total, 600, alive)
        recover = monitor.recovery(resumed, total)
        _, peak = rss_mib(pid)
        assert worker.terminate() == 0
    dead = read_topic(bed.bootstrap, dlq, timeout=60)
    counts = ids_of(read_topic(sink_bed.bootstrap, out, timeout=300))
    # Every id of the second run must be there; the first tenth doubled them, so count each
    # id's copies beyond the two runs' expectation.
    expected = {i: 1 + (1 if i < records // 10 else 0) for i in range(records)}
    lost = sum(1 for i, n in expected.items() if counts[i] < n)
    dup = sum(max(0, counts[i] - n) for i, n in expected.items())
    bound_mib = baseline + 2 * max_in_flight_bytes / 2**20 + 64
    notes = [
        f"RSS before the outage {baseline:.0f} MiB, highest during it {peak_during:.0f} MiB, "
        f"bound {bound_mib:.0f} MiB (baseline + 2 x maxInFlightBytes + 64 MiB)",
        f"{len(dead)} records dead-lettered; {stalled_at} of {total} committed when the "
        "broker came back",
    ]
    assert not dead, f"records were dead-lettered for an outage: {len(dead)}"
    assert peak_during <= bound_mib, notes[0]
    return Outcome(
        "3. Kafka sink: the output topic's broker unreachable",
        total,
        f"output broker frozen (SIGSTOP) for {outage:g}s",
        1,
        lost,
        dup,
        0,
        recover,
        peak_rss_mib=peak,
        notes=notes,
    )


# -- 3. the Spark sink's database or Connect server down --------------------------------------


class SparkOutage(Protocol):
    """What scenario 3's Spark halves do to the sink's far side, and how they read it."""

    title: str
    faults: str

    def sink(self) -> dict[str, Any]: ...
    def down(self) -> None: ...
    def up(self) -> None: ...
    def ids(self) -> Counter[int]: ...


def spark_sink_outage(
    bed: Bed,
    workdir: Path,
    target: SparkOutage,
    *,
    records: int,
    outage: float,
    max_in_flight_bytes: int = 4 * 1024 * 1024,
    partitions: int = 2,
    restart_on_exit: bool = False,
) -> Outcome:
    """One worker with ``target``'s Spark sink; the far side is taken down for ``outage``
    seconds while records keep arriving, then brought back. The worker must hold its memory
    near ``limits.maxInFlightBytes`` (peak RSS of the worker's own process), dead-letter
    nothing, and resume by itself. With ``restart_on_exit`` a worker that exits is started
    again the way Kubernetes restarts a pod's container (counted in the notes)."""
    src = new_topic(bed, "spark-in", partitions)
    dlq = new_topic(bed, "spark-dlq", 1)
    group = f"chaos-spark-{uuid.uuid4().hex[:8]}"
    doc = manifest(
        "sparkout",
        bed.bootstrap,
        [src],
        sink=target.sink(),
        group=group,
        limits={"maxInFlightMessages": 1_000_000, "maxInFlightBytes": max_in_flight_bytes},
        # One retry only: an outage taken for a bad batch would be dead-lettered at once.
        errors=dead_lettering(dlq, retries=1, backoff=0.5),
    )
    path = write_manifest(workdir / "sparkout.yaml", doc)
    workers = [WorkerProcess(path, workdir / "sparkout-w.log").start()]
    restarts: list[str] = []

    def alive() -> None:
        w = workers[0]
        assert w.proc is not None
        if w.proc.poll() is None:
            return
        if not restart_on_exit:
            raise AssertionError(f"the worker exited ({w.proc.returncode}):\n{w.output()[-3000:]}")
        tail = [line for line in w.output().splitlines() if line.strip()][-1:]
        restarts.append(f"exit {w.proc.returncode}: {tail[0][-200:] if tail else ''}")
        w.wait(1)
        workers[0] = WorkerProcess(path, workdir / f"sparkout-w{len(restarts)}.log").start()

    def pid() -> int:
        proc = workers[0].proc
        assert proc is not None
        return proc.pid

    first = max(1, records // 10)
    with running(workers), ProgressMonitor(bed.bootstrap, group, src, partitions) as monitor:
        # A first tenth flows normally (the Spark session starts), so the baseline holds a
        # warmed-up worker.
        start_producing(bed.bootstrap, src, first, seconds=1, size=200).join(120)
        monitor.wait_for(first, 300, alive)
        baseline, _ = rss_mib(pid())
        target.down()
        fault_at = time.monotonic()
        peak_during = 0.0
        try:
            rest = start_producing(
                bed.bootstrap, src, records, seconds=min(outage / 2, 20), size=200
            )
            while time.monotonic() - fault_at < outage:
                alive()
                with contextlib.suppress(OSError, KeyError):
                    peak_during = max(peak_during, rss_mib(pid())[0])
                time.sleep(0.5)
            rest.join(300)  # ids 0.. again: the second run's ids are what the check counts
            stalled_at = monitor.latest()
        finally:
            target.up()
        resumed = time.monotonic()
        total = records + first
        monitor.wait_for(total, 600, alive)
        recover = monitor.recovery(resumed, total)
        _, peak = rss_mib(pid())
        assert workers[0].terminate() == 0, workers[0].output()[-3000:]
    dead = read_topic(bed.bootstrap, dlq, timeout=60)
    counts = target.ids()
    expected = {i: 1 + (1 if i < first else 0) for i in range(records)}
    lost = sum(1 for i, n in expected.items() if counts[i] < n)
    dup = sum(max(0, counts[i] - n) for i, n in expected.items())
    bound_mib = baseline + 2 * max_in_flight_bytes / 2**20 + 64
    notes = [
        f"RSS of the worker's process before the outage {baseline:.0f} MiB, highest during it "
        f"{peak_during:.0f} MiB, bound {bound_mib:.0f} MiB (baseline + 2 x maxInFlightBytes "
        "+ 64 MiB)",
        f"{len(dead)} records dead-lettered; {stalled_at} of {total} committed when the sink "
        "came back",
    ]
    if restart_on_exit:
        notes.append(
            f"worker restarted {len(restarts)} time(s) as Kubernetes would after it exited"
            + (f" ({'; '.join(restarts)})" if restarts else ": it resumed by itself")
        )
    assert not dead, f"records were dead-lettered for an outage: {len(dead)}"
    assert peak_during <= bound_mib, notes[0]
    return Outcome(
        target.title,
        total,
        target.faults.format(outage=outage),
        1,
        lost,
        dup,
        0,
        recover,
        peak_rss_mib=peak,
        notes=notes,
    )


@dataclass
class PostgresDown:
    """The JDBC sink (an in-process Spark driver) into a PostgreSQL stopped and started."""

    server: Any  # offtake_testbed.postgres.PostgresServer
    table: str = field(default_factory=lambda: f"chaos_{uuid.uuid4().hex[:8]}")
    title: str = "3. JDBC sink: PostgreSQL stopped"
    faults: str = "PostgreSQL stopped (pg_ctl stop -m fast) for {outage:g}s"

    def sink(self) -> dict[str, Any]:
        jdbc = {"url": self.server.jdbc_url, "table": self.table, "user": self.server.user}
        return {
            "spark": {
                "format": "jdbc",
                "jdbc": jdbc,
                "batch": {"maxRecords": 5000, "maxIntervalSeconds": 1},
                "submit": {"mode": "local", "master": "local[1]", "conf": dict(_SPARK_CONF)},
            }
        }

    def down(self) -> None:
        self.server.shut_down()

    def up(self) -> None:
        self.server.start_again()

    def ids(self) -> Counter[int]:
        import psycopg

        with psycopg.connect(self.server.dsn) as conn:
            got = conn.execute(f"SELECT id, count(*) FROM {self.table} GROUP BY id").fetchall()
        return Counter({int(i): int(n) for i, n in got})


@dataclass
class ConnectKilled:
    """A parquet Spark sink through a Spark Connect server SIGKILLed and started again."""

    server: Any  # tests/spark/connect_server.py's ConnectServer
    path: Path
    title: str = "3. Spark sink via Spark Connect: the server SIGKILLed and restarted"
    faults: str = "Spark Connect server SIGKILLed, started again after {outage:g}s"

    def sink(self) -> dict[str, Any]:
        return {
            "spark": {
                "format": "parquet",
                "path": str(self.path),
                "batch": {"maxRecords": 5000, "maxIntervalSeconds": 1},
                "submit": {"mode": "connect", "connectUrl": self.server.url, "conf": _SPARK_CONF},
            }
        }

    def down(self) -> None:
        self.server.kill()

    def up(self) -> None:
        self.server.start()

    def ids(self) -> Counter[int]:
        import pyarrow.dataset as ds

        if not self.path.exists():
            return Counter()
        table = ds.dataset(self.path).to_table(columns=["id"])
        return Counter(int(i) for i in table.column("id").to_pylist())


_SPARK_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}


# -- 5. bad payloads and bad processors --------------------------------------------------------


def fuzzed_payloads(seed: int, count: int) -> list[bytes]:
    """Random byte strings mixed with near-valid JSON: truncated, wrong types, bad UTF-8."""
    rng = random.Random(seed)
    out: list[bytes] = []
    for i in range(count):
        kind = rng.randrange(6)
        if kind == 0:
            out.append(rng.randbytes(rng.randrange(0, 64)))
        elif kind == 1:
            out.append(json.dumps({"id": i, "v": rng.random()}).encode()[: rng.randrange(1, 12)])
        elif kind == 2:
            out.append(b"\xff\xfe" + rng.randbytes(8))
        elif kind == 3:
            out.append(json.dumps([i, None, "x" * rng.randrange(10)]).encode())
        elif kind == 4:
            out.append(b"")
        else:
            out.append(json.dumps({"id": i}).encode())
    return out


def fuzzed_wire_payloads(seed: int, good: list[bytes]) -> tuple[list[bytes], int]:
    """Schema'd values (the Confluent wire format: magic byte, schema id, data) around valid
    ones: random bytes, a wrong magic byte, an unknown schema id, truncated data, a valid
    header over random data, empty values. Returns the values and how many are valid."""
    rng = random.Random(seed)
    out: list[bytes] = []
    valid = 0
    for value in good:
        kind = rng.randrange(7)
        if kind == 0:
            out.append(rng.randbytes(rng.randrange(1, 48)))
        elif kind == 1:
            out.append(bytes([rng.randrange(1, 256)]) + value[1:])  # wrong magic byte
        elif kind == 2:
            out.append(b"\x00" + rng.randrange(900_000, 999_999).to_bytes(4, "big") + value[5:])
        elif kind == 3:
            out.append(value[: rng.randrange(0, len(value))])  # truncated
        elif kind == 4:
            out.append(value[:5] + rng.randbytes(rng.randrange(1, 32)))
        else:
            out.append(value)
            valid += 1
    return out, valid


def produce_raw(bootstrap: str, topic: str, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "logger": _log})
    for n, v in enumerate(values):
        p.produce(topic, v, key=str(n).encode())
    assert p.flush(60) == 0


@dataclass
class Settled:
    """What one worker made of a topic of bad input: the output, the dead letters, the time
    until the group committed everything, the highest RSS seen of a function pool process."""

    delivered: list[Any]
    dead: list[Any]
    seconds: float
    peak_pool_rss_mib: float | None = None
    log: str = ""

    def error_classes(self) -> Counter[str]:
        return Counter(
            (dict(m.headers() or ()).get("offtake.error.class") or b"").decode() for m in self.dead
        )


class PoolRss(Sampler):
    """Samples the peak RSS (VmHWM) of a worker's function pool processes (its children
    started by multiprocessing's spawn) every 50 ms, while they come and go."""

    every = 0.05

    def __init__(self, parent: int) -> None:
        super().__init__()
        self.parent = parent
        self.peak = 0.0

    def _children(self) -> Iterator[int]:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                if ppid == self.parent and b"spawn_main" in (entry / "cmdline").read_bytes():
                    yield int(entry.name)

    def sample(self) -> None:
        for pid in self._children():
            with contextlib.suppress(OSError, KeyError, ValueError):
                self.peak = max(self.peak, rss_mib(pid)[1])


def settled_without_stall(
    bed: Bed,
    workdir: Path,
    name: str,
    values: list[bytes],
    *,
    fmt: str = "json",
    source: Mapping[str, Any] | None = None,
    processor: str | Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    out_config: Mapping[str, str] | None = None,
    timeout: float = 180,
) -> Settled:
    """Run one worker over ``values`` with errors.policy dlq (one retry) and return what came
    out. Fails if the partition stalls (nothing committed to the end within ``timeout``)."""
    src = new_topic(bed, f"{name}-in", 2)
    out = new_topic(bed, f"{name}-out", 2, out_config)
    dlq = new_topic(bed, f"{name}-dlq", 1)
    produce_raw(bed.bootstrap, src, values)
    group = f"chaos-{name}-{uuid.uuid4().hex[:8]}"
    spec: dict[str, Any] = {"errors": dead_lettering(dlq, retries=1, backoff=0.05)}
    if processor:
        spec["processor"] = {"function": processor} if isinstance(processor, str) else processor
    doc = manifest(name, bed.bootstrap, [src], sink={"kafka": {"topic": out}}, group=group, **spec)
    doc["spec"]["source"].update({"format": fmt, **(source or {})})
    path = write_manifest(workdir / f"{name}.yaml", doc)
    worker = WorkerProcess(path, workdir / f"{name}.log", env=dict(env or {})).start()
    assert worker.proc is not None
    with (
        running([worker]),
        ProgressMonitor(bed.bootstrap, group, src, 2) as monitor,
        PoolRss(worker.proc.pid) as pool,
    ):
        took = monitor.wait_for(len(values), timeout, _all_alive([worker]))
        assert worker.terminate() == 0, worker.output()[-3000:]
    ends = end_offsets(bed.bootstrap, src, 2)
    assert sum(ends.values()) == len(values)
    return Settled(
        read_topic(bed.bootstrap, out, timeout=120),
        read_topic(bed.bootstrap, dlq, timeout=120),
        took,
        pool.peak or None,
        worker.output(),
    )


def _bad_input(
    scenario: str, faults: str, count: int, settled: Settled, failing: int, *notes: str
) -> Outcome:
    """The row of a bad-input scenario: records neither delivered nor dead-lettered are lost."""
    delivered, dead = len(settled.delivered), len(settled.dead)
    return Outcome(
        scenario,
        count,
        faults,
        failing,
        max(0, count - delivered - dead),
        max(0, delivered + dead - count),
        0,
        settled.seconds,
        settled.peak_pool_rss_mib,
        notes=[
            f"{delivered} delivered, {dead} dead-lettered, all committed in {settled.seconds:.1f}s",
            *notes,
        ],
    )


def fuzzed_format(bed: Bed, workdir: Path, fmt: str, count: int, seed: int) -> Outcome:
    """Fuzzed payloads under source.format json | string | bytes: all settle, none stall."""
    values = fuzzed_payloads(seed, count)
    settled = settled_without_stall(bed, workdir, f"fuzz-{fmt}", values, fmt=fmt)
    if fmt == "bytes":
        assert not settled.dead, "every byte string is a valid bytes record"
    else:
        assert settled.dead, "the fuzz held undecodable records, none was dead-lettered"
    return _bad_input(
        f"5. fuzzed payloads, source.format {fmt}",
        "random bytes, truncated JSON, bad UTF-8, empty values",
        count,
        settled,
        len(settled.dead),
    )


def fuzzed_schema_format(
    bed: Bed, workdir: Path, fmt: str, count: int, seed: int, registry_url: str
) -> Outcome:
    """Fuzzed wire-format payloads under source.format avro | protobuf | jsonschema, decoded
    with the test bed's schema registry: every valid record delivered, the rest settle through
    the error policy (dead letters naming the reason), no partition stalls."""
    from .schemas import PROTOBUF_MESSAGE, order, serializer

    name = f"fuzz-{fmt}-{uuid.uuid4().hex[:6]}"
    encode = serializer(fmt, registry_url, f"{name}-schema")
    values, valid = fuzzed_wire_payloads(seed, [encode(order(i)) for i in range(count)])
    source: dict[str, Any] = {"schemaRegistry": {"url": registry_url}}
    if fmt == "protobuf":
        source["protobufMessage"] = PROTOBUF_MESSAGE
    settled = settled_without_stall(bed, workdir, name, values, fmt=fmt, source=source)
    # Random data behind a valid header can happen to decode: at least the valid ones arrive.
    assert len(settled.delivered) >= valid, (len(settled.delivered), valid)
    assert settled.dead, "the fuzz held undecodable records, none was dead-lettered"
    reasons = Counter(
        (dict(m.headers() or ()).get("offtake.error.reason") or b"").decode() for m in settled.dead
    )
    assert reasons["not-wire-format"] and reasons["unknown-schema-id"], reasons
    return _bad_input(
        f"5. fuzzed payloads, source.format {fmt}",
        "random bytes, wrong magic byte, unknown schema id, truncated, random data",
        count,
        settled,
        len(settled.dead),
        "dead letters by reason: " + ", ".join(f"{r} {n}" for r, n in sorted(reasons.items())),
    )


def oversize_records(bed: Bed, workdir: Path, count: int) -> Outcome:
    """Every 50th record comes out of the processor at ~2 MB for a topic limit of 100 kB."""
    values = [json.dumps({"id": i, "big": i % 50 == 0}).encode() for i in range(count)]
    settled = settled_without_stall(
        bed,
        workdir,
        "oversize",
        values,
        processor="support.processors:inflate",
        out_config={"max.message.bytes": "100000"},
    )
    big = len(range(0, count, 50))
    assert len(settled.dead) == big, (len(settled.dead), big)
    return _bad_input(
        "5. output records larger than the topic's max.message.bytes",
        f"{big} records of ~2 MB for a 100 kB limit",
        count,
        settled,
        big,
    )


def failing_processor(bed: Bed, workdir: Path, count: int) -> Outcome:
    """support.processors:misbehave raises on every 7th id, returns an unsendable object on
    every 11th: exactly those are dead-lettered."""
    values = [json.dumps({"id": i}).encode() for i in range(1, count + 1)]
    settled = settled_without_stall(
        bed, workdir, "misbehave", values, processor="support.processors:misbehave"
    )
    failing = sum(1 for i in range(1, count + 1) if i % 7 == 0 or i % 11 == 0)
    assert len(settled.dead) == failing, (len(settled.dead), failing)
    return _bad_input(
        "5. processor raises / returns an unsendable object",
        f"{failing} records fail in the processor or cannot be encoded",
        count,
        settled,
        failing,
    )


def _ids(messages: list[Any]) -> Counter[int]:
    return Counter(json.loads(m.value())["id"] for m in messages)


def hung_processor(
    bed: Bed, workdir: Path, count: int, hangs: int, timeout_seconds: float = 1.0
) -> Outcome:
    """A function that never returns on ``hangs`` records, bounded by
    processor.timeoutSeconds: each such call is killed with its pool process (which is
    replaced), the record retried once, then dead-lettered naming ProcessorTimeout; every
    other record is delivered once and the partitions move on."""
    every = count // hangs
    hung = {i for i in range(count) if i % every == every // 2}
    values = [json.dumps({"id": i, "hang": i in hung}).encode() for i in range(count)]
    settled = settled_without_stall(
        bed,
        workdir,
        "hang",
        values,
        processor={
            "function": "support.processors:hang_on_marked",
            "timeoutSeconds": timeout_seconds,
            "parallelism": 2,
        },
    )
    delivered, dead = _ids(settled.delivered), _ids(settled.dead)
    assert set(dead) == hung, sorted(set(dead) ^ hung)
    timeout_class = "offtake.processing.parallel.ProcessorTimeout"
    assert settled.error_classes() == Counter({timeout_class: len(hung)}), settled.error_classes()
    lost, duplicated = lost_and_duplicated(count, delivered + dead)
    processes = len({json.loads(m.value())["pid"] for m in settled.delivered})
    kills = sum(
        1
        for line in settled.log.splitlines()
        if '"logger": "offtake.processing"' in line and "ran past" in line
    )
    assert kills == 2 * len(hung), (kills, len(hung))  # each: the first try and one retry
    return Outcome(
        "5. processor hangs (processor.timeoutSeconds)",
        count,
        f"{len(hung)} records whose call never returns; timeoutSeconds {timeout_seconds:g}, "
        "1 retry",
        len(hung),
        lost,
        duplicated,
        0,
        settled.seconds,
        notes=[
            f"{len(delivered)} delivered, {len(dead)} dead-lettered with offtake.error.class "
            f"{timeout_class}, all committed in {settled.seconds:.1f}s; {kills} calls killed "
            f"with their process and replaced; {processes} pool processes (2 at a time) "
            "delivered records"
        ],
    )


def leaking_processor(
    bed: Bed, workdir: Path, count: int, leak_kib: int = 1024, max_memory_mib: int = 128
) -> Outcome:
    """A function that keeps ``leak_kib`` of every record for good, under
    processor.maxMemoryMiB: its pool process is replaced between two calls whenever it passes
    the bound, nothing fails, nothing is lost or repeated, and no pool process grew past the
    bound by more than one call's leak (plus sampling slack)."""
    values = [json.dumps({"id": i}).encode() for i in range(count)]
    settled = settled_without_stall(
        bed,
        workdir,
        "leak",
        values,
        processor={"function": "support.processors:leak", "maxMemoryMiB": max_memory_mib},
        env={"OFFTAKE_TEST_LEAK_KIB": str(leak_kib)},
    )
    delivered = _ids(settled.delivered)
    lost, duplicated = lost_and_duplicated(count, delivered)
    processes = len({json.loads(m.value())["pid"] for m in settled.delivered})
    leaked = count * leak_kib / 1024
    assert not settled.dead, settled.error_classes()
    assert processes >= int(leaked // max_memory_mib), (processes, leaked)
    peak = settled.peak_pool_rss_mib
    assert peak is not None and peak <= max_memory_mib + 2 * leak_kib / 1024 + 8, peak
    return Outcome(
        "5. processor leaks memory (processor.maxMemoryMiB)",
        count,
        f"{leak_kib} KiB kept per record ({leaked:.0f} MiB in all); maxMemoryMiB {max_memory_mib}",
        processes - 1,
        lost,
        duplicated,
        0,
        settled.seconds,
        peak,
        notes=[
            f"{len(delivered)} delivered, 0 dead-lettered, all committed in "
            f"{settled.seconds:.1f}s; {processes} pool processes in turn (each replaced "
            f"between two calls past {max_memory_mib} MiB); highest pool process RSS seen "
            f"{peak:.0f} MiB"
        ],
    )


def leak_under_memory_limit(
    bed: Bed,
    workdir: Path,
    count: int,
    *,
    leak_kib: int = 128,
    limit_mib: int = 256,
    max_in_flight: int = 500,
    seconds: float = 12.0,
) -> Outcome:
    """A function that leaks in the worker's own thread (no processor.maxMemoryMiB), the
    worker in a memory cgroup of ``limit_mib`` as a pod's container with that memory limit
    is: the kernel's OOM killer ends it, it is started again as the kubelet would, and it
    resumes from its group's last commit. Nothing lost; duplicates bounded by kills x
    ``limits.maxInFlightMessages``."""
    src, out = new_topic(bed, "oom-in", 2), new_topic(bed, "oom-out", 2)
    path, group = pipeline(
        bed,
        workdir,
        "oom",
        src,
        out,
        2,
        processor={"function": "support.processors:leak"},
        limits={"maxInFlightMessages": max_in_flight},
    )
    env = {"OFFTAKE_TEST_LEAK_KIB": str(leak_kib)}
    producer = start_producing(bed.bootstrap, src, count, seconds=seconds)
    name = f"offtake-chaos-oom-{uuid.uuid4().hex[:8]}"
    kills: list[float] = []

    def start(n: int) -> WorkerProcess:
        worker = WorkerProcess(path, workdir / f"oom-{n}.log", env=env).start()
        assert worker.proc is not None
        cgroup.add(worker.proc.pid)
        return worker

    with (
        MemoryCgroup(name, limit_mib * 2**20) as cgroup,
        ProgressMonitor(bed.bootstrap, group, src, 2) as monitor,
    ):
        workers = [start(0)]
        with running(workers):
            began = time.monotonic()
            while monitor.latest() < count:
                proc = workers[-1].proc
                assert proc is not None
                if proc.poll() is not None:
                    assert proc.returncode == -signal.SIGKILL, workers[-1].output()[-3000:]
                    kills.append(time.monotonic())
                    assert len(kills) <= 40, "the worker was killed 40 times: no progress"
                    workers.append(start(len(kills)))
                assert time.monotonic() - began < 300, (
                    f"group committed {monitor.latest()} of {count} records within 300s"
                )
                time.sleep(0.2)
            took = time.monotonic() - began
            producer.join(60)
            assert workers[-1].terminate() == 0, workers[-1].output()[-3000:]
            oom_kills = cgroup.oom_kills()
            recover = max((monitor.recovery(t, count) for t in kills), default=0.0)
    # Each exit was the kernel's OOM kill: the limit was reached, not a crash of ours.
    assert kills and oom_kills == len(kills), (len(kills), oom_kills)
    lost, duplicated = count_output(bed.bootstrap, out, count)
    return Outcome(
        "5. processor leaks in the worker's thread, under a kernel memory limit",
        count,
        f"{leak_kib} KiB kept per record; the worker in a {limit_mib} MiB memory cgroup, "
        f"OOM-killed {len(kills)} times and started again",
        len(kills),
        lost,
        duplicated,
        len(kills) * max_in_flight,
        recover,
        notes=[
            f"the kernel OOM-killed the worker {oom_kills} times (the cgroup's oom_kill "
            f"count); each time it was started again and resumed from its last commit; all "
            f"{count} committed {took:.1f}s after the first start"
        ],
    )


# -- 6. a sidecar that crashes or stops answering ----------------------------------------------


def readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def start_sidecar(port: int) -> subprocess.Popen[str]:
    """The reference sidecar processor (examples/sidecar/processor.py) on ``port``."""
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "sidecar" / "processor.py"), "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening" in line, f"the sidecar did not start: {line!r}"
    return proc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sidecar_outages(
    bed: Bed, workdir: Path, *, records: int, outage: float, partitions: int = 3
) -> Outcome:
    """A worker in sidecar mode while its sidecar is first SIGKILLed (then started again on
    the same port), then frozen with SIGSTOP (it accepts connections and never answers; the
    worker's timeoutSeconds bounds each call). During each outage the worker must report not
    ready, commit nothing it has not delivered, and dead-letter nothing; afterwards it resumes."""
    src = new_topic(bed, "sidecar-in", partitions)
    out = new_topic(bed, "sidecar-out", partitions)
    dlq = new_topic(bed, "sidecar-dlq", 1)
    port = _free_port()
    group = f"chaos-sidecar-{uuid.uuid4().hex[:8]}"
    doc = manifest(
        "sidecar",
        bed.bootstrap,
        [src],
        sink={"kafka": {"topic": out}},
        group=group,
        processor={"container": {"image": "example", "port": port, "timeoutSeconds": 2}},
        errors=dead_lettering(dlq, retries=2, backoff=0.1),
    )
    path = write_manifest(workdir / "sidecar.yaml", doc)
    sidecar = start_sidecar(port)
    worker = WorkerProcess(path, workdir / "sidecar-w.log").start()
    alive = _all_alive([worker])
    notes: list[str] = []
    faults: list[float] = []
    back: list[float] = []  # when each outage ended: recovery counts from there
    # Records keep arriving through both outages: an idle worker calls no processor.
    producer = start_producing(bed.bootstrap, src, records, seconds=4 * outage + 5)
    try:
        with running([worker]), ProgressMonitor(bed.bootstrap, group, src, partitions) as monitor:
            wport = worker.metrics_port()
            monitor.wait_for(min(records, 500), 120, alive)
            for how in ("SIGKILL", "SIGSTOP"):
                if how == "SIGKILL":
                    sidecar.kill()
                    sidecar.wait()
                else:
                    sidecar.send_signal(signal.SIGSTOP)
                faults.append(time.monotonic())
                statuses: list[int] = []
                overcommitted = 0
                while time.monotonic() - faults[-1] < outage:
                    alive()
                    for _ in range(5):  # readiness often; the output check below is slower
                        statuses.append(readyz(wport))
                        time.sleep(0.1)
                    done = monitor.latest()
                    delivered = len(read_topic(bed.bootstrap, out, timeout=60))
                    # A commit counts only records that reached the output (at least once).
                    overcommitted = max(overcommitted, done - delivered)
                    time.sleep(0.5)
                if how == "SIGKILL":
                    sidecar = start_sidecar(port)
                else:
                    sidecar.send_signal(signal.SIGCONT)
                back.append(time.monotonic())
                notes.append(
                    f"sidecar {how} for {outage:g}s: /readyz answered {statuses.count(503)} of "
                    f"{len(statuses)} probes with 503; committed past delivered: {overcommitted}"
                )
                assert 503 in statuses, f"never not ready while the sidecar was down: {statuses}"
                assert overcommitted <= 0, notes[-1]
                monitor.wait_for(min(records, monitor.latest() + 1), 120, alive)
            producer.join(300)
            monitor.wait_for(records, 300, alive)
            assert readyz(wport) == 200
            recover = max(monitor.recovery(t, records) for t in back)
            assert worker.terminate() == 0
    finally:
        if sidecar.poll() is None:
            sidecar.send_signal(signal.SIGCONT)
            sidecar.kill()
            sidecar.wait()
    dead = read_topic(bed.bootstrap, dlq, timeout=60)
    assert not dead, f"{len(dead)} records dead-lettered because the sidecar was down"
    lost, dup = count_output(bed.bootstrap, out, records)
    return Outcome(
        "6. sidecar processor crashed, then stopped answering",
        records,
        f"sidecar SIGKILLed for {outage:g}s, then SIGSTOPped for {outage:g}s",
        2,
        lost,
        dup,
        2 * 10_000,
        recover,
        notes=notes,
    )


# -- 4. the operator SIGKILLed mid-reconcile ---------------------------------------------------

_CHILD_KINDS = "deployments,configmaps,services,poddisruptionbudgets"


class Kube(Protocol):
    @property
    def kubeconfig(self) -> Path: ...

    def kubectl(
        self, *args: str, check: bool = ..., input: str | None = ..., timeout: float = ...
    ) -> subprocess.CompletedProcess[str]: ...


def apply_crd(kube: Kube) -> None:
    """Apply the ConsumerPipeline CRD and wait until the API server serves it."""
    kube.kubectl("apply", "-f", str(REPO / "crds" / "consumerpipeline.yaml"))
    # Right after apply the CRD may have no status.conditions yet, and kubectl wait then
    # fails at once ("accessor error") instead of waiting: ask again until it answers.
    deadline = time.monotonic() + 90
    while (
        kube.kubectl(
            "wait",
            "--for=condition=Established",
            "crd/consumerpipelines.offtake.dev",
            "--timeout=10s",
            check=False,
        ).returncode
        != 0
    ):
        if time.monotonic() > deadline:
            raise AssertionError("the ConsumerPipeline CRD was not established in 90 s")
        time.sleep(1)


def _start_operator(kube: Kube, namespace: str, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "KUBECONFIG": str(kube.kubeconfig),
        "OFFTAKE_LAG_SOURCE": "off",  # no broker behind these pipelines
        "OFFTAKE_RESYNC_SECONDS": "60",
        "OFFTAKE_LIVENESS_ENDPOINT": "",
        "OFFTAKE_NAMESPACES": namespace,
    }
    with log.open("ab") as out:
        return subprocess.Popen(["offtake-operator"], env=env, stdout=out, stderr=subprocess.STDOUT)


def _children(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    done = kube.kubectl(
        "get", _CHILD_KINDS, "-n", namespace, "-l", "offtake.dev/pipeline", "-o", "json"
    )
    items: list[dict[str, Any]] = json.loads(done.stdout)["items"]
    return items


def _pipelines(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    done = kube.kubectl("get", "consumerpipelines", "-n", namespace, "-o", "json")
    items: list[dict[str, Any]] = json.loads(done.stdout)["items"]
    return items


def operator_kills(
    kube: Kube, namespace: str, workdir: Path, *, pipelines: int, kills: int, every: float = 2.0
) -> Outcome:
    """``pipelines`` pipelines applied at once; the operator (its own process, as in its pod)
    is SIGKILLed ``kills`` times while it reconciles them, each time restarted. While it is
    down, a fifth of the pipelines get replicas 2 and a tenth are deleted. After the last
    restart every pipeline must converge (status.observedGeneration = generation, its
    Deployment at the replicas asked for) with exactly one child of each kind, and no child
    may be left without its pipeline."""
    names = [f"chaos-{i:03d}" for i in range(pipelines)]
    docs = "\n---\n".join(json.dumps(one_replica(n)) for n in names)
    log = workdir / "operator.log"
    operator = _start_operator(kube, namespace, log)
    began = time.monotonic()
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=docs, timeout=300)
    scaled = names[: max(1, pipelines // 5)]
    deleted = names[-max(1, pipelines // 10) :]
    fault_times: list[float] = []
    try:
        for k in range(kills):
            time.sleep(every)
            operator.kill()
            operator.wait()
            fault_times.append(time.monotonic())
            if k == 0:  # changes the operator must find when it is back
                for name in scaled:
                    kube.kubectl(
                        "patch",
                        "consumerpipeline",
                        name,
                        "-n",
                        namespace,
                        "--type=merge",
                        "-p",
                        '{"spec": {"replicas": 2}}',
                    )
                kube.kubectl(
                    "delete", "consumerpipeline", "-n", namespace, "--wait=false", *deleted
                )
            operator = _start_operator(kube, namespace, log)
        want = {n: (2 if n in scaled else 1) for n in names if n not in deleted}
        deadline = time.monotonic() + 300
        problems: list[str] = ["not checked yet"]
        while problems and time.monotonic() < deadline:
            assert operator.poll() is None, log.read_text(errors="replace")[-3000:]
            problems = _convergence_problems(kube, namespace, want)
            if problems:
                time.sleep(1.0)
        converged = time.monotonic()
    finally:
        stop_process(operator)
    assert not problems, f"{len(problems)} problems after 300s, e.g. {problems[:5]}"
    duplicated, orphaned = _duplicates_and_orphans(kube, namespace)
    return Outcome(
        f"4. operator SIGKILLed while reconciling {pipelines} pipelines",
        pipelines,
        f"{kills} operator SIGKILLs {every:g}s apart; {len(scaled)} pipelines scaled and "
        f"{len(deleted)} deleted while it was down",
        kills,
        orphaned,
        duplicated,
        0,
        converged - fault_times[-1] if fault_times else converged - began,
        notes=[
            f"all {len(want)} pipelines converged {converged - began:.1f}s after they were applied",
            "lost = children left without their pipeline; duplicated = extra children",
        ],
    )


def _convergence_problems(kube: Kube, namespace: str, want: dict[str, int]) -> list[str]:
    problems = []
    found = {p["metadata"]["name"]: p for p in _pipelines(kube, namespace)}
    deployments = {
        c["metadata"]["labels"]["offtake.dev/pipeline"]: c
        for c in _children(kube, namespace)
        if c["kind"] == "Deployment"
    }
    for name, replicas in want.items():
        p = found.get(name)
        if p is None:
            problems.append(f"{name}: gone")
            continue
        status = p.get("status") or {}
        if status.get("observedGeneration") != p["metadata"].get("generation"):
            problems.append(f"{name}: observedGeneration {status.get('observedGeneration')}")
        d = deployments.get(name)
        if d is None or d["spec"].get("replicas") != replicas:
            problems.append(
                f"{name}: deployment {None if d is None else d['spec'].get('replicas')}"
            )
    extra = set(found) - set(want)
    problems += [f"{name}: not deleted" for name in extra]
    stale = set(deployments) - set(want)
    problems += [f"{name}: deployment of a deleted pipeline" for name in stale]
    return problems


def _duplicates_and_orphans(kube: Kube, namespace: str) -> tuple[int, int]:
    """(children beyond one per kind and pipeline, children whose owner pipeline is gone)."""
    live = {p["metadata"]["uid"] for p in _pipelines(kube, namespace)}
    per: dict[tuple[str, str], int] = {}
    orphans = 0
    for c in _children(kube, namespace):
        key = (c["kind"], c["metadata"]["labels"]["offtake.dev/pipeline"])
        per[key] = per.get(key, 0) + 1
        owners = {o.get("uid") for o in c["metadata"].get("ownerReferences") or []}
        if not owners & live:
            orphans += 1
    return sum(n - 1 for n in per.values()), orphans
