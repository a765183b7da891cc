"""Scenario 1 of docs/reliability.md: workers SIGKILLed at random and started again."""

from __future__ import annotations

import random
import time
from pathlib import Path

from ..workers import WorkerProcess
from .common import (
    Bed,
    Outcome,
    ProgressMonitor,
    all_alive,
    count_output,
    new_topic,
    pipeline,
    running,
    start_producing,
)


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
        monitor.wait_for(records, 600, all_alive(workers))
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
