"""Scenario 1 of docs/reliability.md: workers SIGKILLed at random and started again."""

from __future__ import annotations

import random
import time
from pathlib import Path

from .common import Bed, CopyUnderFaults, Outcome


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
    rng = random.Random(seed)
    faults: list[float] = []
    seconds = min(20.0, records / 20_000)
    with CopyUnderFaults(
        bed,
        workdir,
        "kills",
        partitions=partitions,
        records=records,
        seconds=seconds,
        workers=3,
        max_in_flight=max_in_flight,
    ) as run:
        for k in range(kills):
            time.sleep(every)
            victim = rng.randrange(3)
            run.workers[victim].kill()
            faults.append(time.monotonic())
            run.workers[victim] = run.start_worker(f"w{victim}-{k}")
        recover, lost, dup = run.finish(faults)
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
