"""Scenario 3 of docs/reliability.md: a sink's far side down under a running worker: the
Kafka sink's broker unreachable, the JDBC sink's PostgreSQL stopped, the Spark Connect server
SIGKILLed."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from offtake_testbed.kafka import read_topic

from ..workers import WorkerProcess, dead_lettering, ids_of, manifest, write_manifest
from .common import (
    Bed,
    Outcome,
    ProgressMonitor,
    all_alive,
    new_topic,
    rss_mib,
    running,
    start_producing,
)


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
    alive = all_alive([worker])
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
