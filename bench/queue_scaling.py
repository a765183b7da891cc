"""Queue mode's selling point, measured: more workers than partitions on a CPU-bound function.

    python bench/queue_scaling.py [--records N] [--workers 1,2,4] [--json PATH]

One real Kafka broker, one input topic with ONE partition filled with the bench's records,
the ``cpu-p1`` workload (a fixed amount of hashing per record, bench_workloads.offtake_burn),
then, each on a fresh output topic:

- ``offtake``: one worker on a consumer group. A second worker would idle: one partition is
  one consumer's;
- ``offtake-queue xN``: N workers of one share group (``source.groupType: share``), every
  one taking records of the same partition.

Each run is ``offtake worker`` processes driven through the CLI (bench/passthrough.py's
``command``), stopped with SIGTERM once every record is out. Throughput is steady state as in
passthrough.py: distinct output records over the time from the first to the last output
record's log-append time; every run's output is checked (every input key, duplicates counted).

The ceiling is the machine's: N processes of CPU-bound work scale with the free cores, so on a
2-core machine shared with other jobs, about 2x is all there is to see, whatever N.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

# Run as a script: its folder (the bench's modules) is first on sys.path.
from passthrough import (
    BENCH,
    WORKLOADS,
    Job,
    Process,
    Watcher,
    command,
    create_output,
    fill,
    log,
    prepare,
    read_keys_and_times,
    steady_rate,
    verify_output,
)

CPU = next(w for w in WORKLOADS if w.name == "cpu-p1")


def run(
    broker: Any,
    watcher: Watcher,
    name: str,
    workers: int,
    source: str,
    records: int,
    work: Path,
) -> dict[str, Any]:
    """``workers`` processes of contender ``name`` (offtake or offtake-queue) on ``source``."""
    tag = f"{name}-x{workers}"
    output = f"out-{tag}"
    create_output(broker, output)
    job = Job(broker.bootstrap, source, output, f"scale-{tag}-{uuid.uuid4().hex[:6]}", CPU)
    argv, env = command(name, job, prepare([name]), work)
    began = time.monotonic()
    processes = [Process(argv, env, work, f"{tag}-{i}") for i in range(workers)]
    status, written, progress_at = "ok", 0, began
    try:
        while written < records:
            if any(p.exited() is not None for p in processes):
                status = "a worker exited"
                break
            now = time.monotonic()
            count = watcher.end(output)
            if count > written:
                written, progress_at = count, now
            elif now - progress_at > 60:
                status = "stalled"
                break
            time.sleep(0.1)
        wall = time.monotonic() - began
    finally:
        codes = [p.stop()[0] for p in processes]
    keys, times = read_keys_and_times(broker.bootstrap, output)
    check = verify_output(records, keys)
    rate = steady_rate(check.unique, times)
    broker.delete_topic(output, missing_ok=True)
    if status == "ok" and not check.complete:
        status = "incomplete"
    return {
        "contender": name,
        "workers": workers,
        "status": status,
        "records_per_second": None if rate is None else round(rate),
        "wall_seconds": round(wall, 2),
        "duplicates": check.duplicates,
        "missing": check.missing,
        "exit_codes": codes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=60_000, help="cpu-p1 records (60,000)")
    parser.add_argument("--workers", default="1,2,4", help="queue-mode worker counts (1,2,4)")
    parser.add_argument("--json", type=Path, help="where to write the figures")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.workers.split(",")]
    stamp = datetime.datetime.now(datetime.UTC)
    out_path = args.json or BENCH / "results" / f"queue-scaling-{stamp:%Y-%m-%d}.json"
    from offtake_testbed.kafka import KAFKA_VERSION, KafkaBroker

    work = Path(tempfile.mkdtemp(prefix="offtake-bench-queue-scaling-"))
    load_at_start = os.getloadavg()[0]
    started = time.monotonic()
    results: list[dict[str, Any]] = []
    try:
        with KafkaBroker() as broker:
            watcher = Watcher(broker.bootstrap)
            try:
                source = "in-cpu-one-partition"
                broker.create_topic(source, 1)
                fill(broker.bootstrap, source, args.records)
                log(f"filled {source} (1 partition): {args.records:,} records")
                plan = [("offtake", 1), *(("offtake-queue", n) for n in counts)]
                for name, n in plan:
                    got = run(broker, watcher, name, n, source, args.records, work)
                    results.append(got)
                    log(
                        f"{name:<13} x{n}  {got['records_per_second'] or 0:>8,} records/s  "
                        f"{got['status']}  dups {got['duplicates']}  missing {got['missing']}"
                    )
            finally:
                watcher.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    anchor = results[0]["records_per_second"]
    for r in results:
        rate = r["records_per_second"]
        r["x_consumer_group"] = round(rate / anchor, 2) if rate and anchor else None
    report = {
        "date": stamp.isoformat(timespec="seconds"),
        "kafka_version": KAFKA_VERSION,
        "cpus": os.cpu_count(),
        "load_average_1m": {"start": round(load_at_start, 2), "end": round(os.getloadavg()[0], 2)},
        "seconds": round(time.monotonic() - started),
        "workload": "cpu-p1 (bench_workloads.offtake_burn), input topic of 1 partition",
        "records": args.records,
        "throughput_measure": (
            "distinct output records / (last - first output record log-append time)"
        ),
        "runs": results,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"\ncpu-p1 on 1 partition, {args.records:,} records; load {load_at_start:.1f} -> "
        f"{report['load_average_1m']['end']} on {os.cpu_count()} CPUs"
    )
    print(f"{'contender':<15} {'workers':>7} {'records/s':>10} {'x 1 consumer':>12} {'dups':>6}")
    for r in results:
        x = "-" if r["x_consumer_group"] is None else f"{r['x_consumer_group']:.2f}"
        print(
            f"{r['contender']:<15} {r['workers']:>7} {r['records_per_second'] or 0:>10,} "
            f"{x:>12} {r['duplicates']:>6}  {r['status']}"
        )
    print(f"\nfigures: {out_path}  ({report['seconds']}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
