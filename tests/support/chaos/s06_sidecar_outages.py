"""Scenario 6 of docs/reliability.md: a sidecar processor that crashes or stops answering."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from offtake_testbed.kafka import read_topic
from offtake_testbed.process import free_port

from ..workers import REPO, WorkerProcess, dead_lettering, manifest, write_manifest
from .common import (
    Bed,
    Outcome,
    ProgressMonitor,
    all_alive,
    count_output,
    new_topic,
    running,
    start_producing,
)


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
    port = free_port()
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
    alive = all_alive([worker])
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
