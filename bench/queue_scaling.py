"""Queue mode's selling point, measured: more workers than partitions, on ONE partition.

    python bench/queue_scaling.py [--function wait|cpu] [--workers 1,2,4,8]
        [--latency-ms 50] [--records-per-worker 300] [--max-poll-records 10]
        [--record-locks 100] [--records 60000] [--json PATH]

One real Kafka broker, an input topic of ONE partition per run, then, each on a fresh output
topic:

- ``offtake`` (``cpu`` only, see :func:`contenders`): one worker on a consumer group. A
  second worker would idle: one partition is one consumer's;
- ``offtake-queue xN``: N workers of one share group (``source.groupType: share``), every
  one taking records of the same partition.

The function (``--function``):

- ``wait`` (the default): one call per record to the test bed's latency service
  (offtake_testbed.latency_service, its own process) answering after ``--latency-ms`` (50 ms),
  as a real enrichment call does (bench/concurrency_calls.py's ``offtake_sync``, one call at a
  time per worker). A worker waits, it does not compute, so N workers can do N times the work
  of one on any machine: the goal is >= 0.8x linear (N x one queue-mode worker's rate).
  Each run's input is ``--records-per-worker`` x N records, produced in batches of
  ``--max-poll-records`` (the broker hands out whole producer batches), so every run lasts
  about as long. Small polls and a small per-partition lock cap are what let N workers share
  one partition: each worker's share consumer takes ``max.poll.records: 10`` (spec.kafka.config)
  and the group's ``share.partition.max.record.locks`` is 100 (the broker's least), so one
  worker cannot acquire the partition's whole backlog in its first poll;
- ``cpu``: the ``cpu-p1`` workload (200 rounds of SHA-256 per record,
  bench_workloads.offtake_burn) on ``--records`` records, the workers' defaults. N processes
  of CPU-bound work scale with the free cores only: on a 2-core machine about 2x, whatever N.

Each run is ``offtake worker`` processes driven through the CLI, stopped with SIGTERM once
every record is out. Throughput is over the middle of the output (:func:`middle_rate`: the
records between the first and last tenth of the output's log-append times), so that workers
starting one after another on a loaded machine, and the last polls' tail, do not count; every
run's output is checked (every input key, duplicates counted).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Run as a script: its folder (the bench's modules) is first on sys.path.
from passthrough import (
    BENCH,
    Process,
    Watcher,
    create_output,
    fill,
    log,
    read_keys_and_times,
    record_value,
    verify_output,
)

FUNCTIONS = ("wait", "cpu")
#: The share of the output over which the rate is read (the middle: see middle_rate).
MIDDLE = 0.8
#: A run that writes nothing new for this long has stalled.
STALL_SECONDS = 60.0


@dataclass(frozen=True)
class Plan:
    function: str  # "wait" or "cpu"
    latency_ms: float = 50.0  # wait: the service's answer time
    records_per_worker: int = 300  # wait: input records per worker of a run
    max_poll_records: int = 10  # wait: the share consumer's max.poll.records, and batch size
    record_locks: int = 100  # wait: the group's share.partition.max.record.locks
    records: int = 60_000  # cpu: input records of every run

    def records_for(self, workers: int) -> int:
        """A run's input: in ``wait`` proportional to the workers (every run about as long)."""
        return self.records_per_worker * workers if self.function == "wait" else self.records


def manifest(
    plan: Plan, bootstrap: str, source: str, output: str, group: str, queue: bool
) -> dict[str, Any]:
    """The ConsumerPipeline every worker of a run gets."""
    spec: dict[str, Any] = {
        "kafka": {"bootstrapServers": bootstrap},
        "source": {"topics": [source], "groupId": group, "format": "bytes"},
        "sink": {"kafka": {"topic": output}},
        # The bench stops each run once measured: a long drain only lengthens the run.
        "shutdown": {"drainTimeoutSeconds": 5},
    }
    if plan.function == "wait":
        spec["processor"] = {"function": "concurrency_calls:offtake_sync"}
        if queue:
            spec["kafka"]["config"] = {"max.poll.records": str(plan.max_poll_records)}
    else:
        spec["processor"] = {"function": "bench_workloads:offtake_burn"}
    if queue:
        spec["source"]["groupType"] = "share"
    return {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": "bench", "namespace": "bench"},
        "spec": spec,
    }


def middle_rate(times_ms: Sequence[int], share: float = MIDDLE) -> float | None:
    """Records per second over the middle ``share`` of the output by log-append time: the
    records from the first tenth's end to the last tenth's start (share 0.8), over that span.
    None when there is no span to measure."""
    if len(times_ms) < 10:
        return None
    ordered = sorted(times_ms)
    cut = round(len(ordered) * (1 - share) / 2)
    first, last = ordered[cut], ordered[len(ordered) - 1 - cut]
    span = (last - first) / 1000
    return (len(ordered) - 1 - 2 * cut) / span if span > 0 else None


def contenders(plan: Plan, counts: Sequence[int]) -> list[tuple[str, int]]:
    """The runs, in order. ``cpu`` starts with one consumer-group worker, the anchor. ``wait``
    has none: a consumer-group worker calling one record at a time does 1000 / latency_ms
    records a second at most (20 at 50 ms; :func:`linearity`'s ``x_ideal`` is against N times
    that), and its output comes a poll's records at a time (the engine hands a partition's
    records over as one unit), so over a run of a few hundred records the output's timestamps
    hold one burst and no rate to read."""
    queue = [("offtake-queue", n) for n in counts]
    return queue if plan.function == "wait" else [("offtake", 1), *queue]


def linearity(runs: list[dict[str, Any]], latency_ms: float | None = None) -> None:
    """Set each run's ``x_consumer_group`` (against the consumer-group worker, if one ran) and,
    for the queue-mode runs, ``x_linear``: its rate over N x one queue-mode worker's; with
    ``latency_ms`` (a waiting function) also ``x_ideal``, over N x 1000 / latency_ms."""
    anchor = next((r for r in runs if r["contender"] == "offtake"), None)
    one = next((r for r in runs if r["contender"] == "offtake-queue" and r["workers"] == 1), None)
    base = anchor["records_per_second"] if anchor else None
    single = one["records_per_second"] if one else None
    for r in runs:
        rate = r["records_per_second"]
        r["x_consumer_group"] = round(rate / base, 2) if rate and base else None
        if r["contender"] == "offtake-queue":
            linear = single * r["workers"] if single else None
            r["x_linear"] = round(rate / linear, 2) if rate and linear else None
            if latency_ms:
                ideal = r["workers"] * 1000 / latency_ms
                r["x_ideal"] = round(rate / ideal, 2) if rate else None


def fill_in_batches(bootstrap: str, topic: str, records: int, batch: int) -> None:
    """``records`` records in producer batches of at most ``batch`` (the broker acquires whole
    batches for a share group: a batch of thousands would go to one worker)."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": batch}
    )
    for i in range(records):
        producer.produce(topic, record_value(i), key=b"%d" % i)
        if i % 1_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError(f"could not fill {topic}")


def set_record_locks(bootstrap: str, group: str, locks: int) -> None:
    """The share group's share.partition.max.record.locks, set before its workers start."""
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    entry = ConfigEntry(
        "share.partition.max.record.locks", str(locks), incremental_operation=AlterConfigOpType.SET
    )
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource], request_timeout=15).values():
        future.result()


def run(
    broker: Any,
    watcher: Watcher,
    plan: Plan,
    name: str,
    workers: int,
    service_url: str | None,
    work: Path,
) -> dict[str, Any]:
    """``workers`` processes of contender ``name`` (offtake or offtake-queue)."""
    tag = f"{name}-x{workers}"
    records = plan.records_for(workers)
    source, output = f"in-{tag}", f"out-{tag}"
    broker.create_topic(source, 1)
    if plan.function == "wait":
        fill_in_batches(broker.bootstrap, source, records, plan.max_poll_records)
    else:
        fill(broker.bootstrap, source, records)
    create_output(broker, output)
    group = f"scale-{tag}-{uuid.uuid4().hex[:6]}"
    queue = name == "offtake-queue"
    if queue and plan.function == "wait":
        set_record_locks(broker.bootstrap, group, plan.record_locks)
    path = work / f"{group}.yaml"
    # JSON is YAML: no YAML library needed to write the manifest.
    path.write_text(json.dumps(manifest(plan, broker.bootstrap, source, output, group, queue)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(BENCH)) if p)
    if service_url is not None:
        env["OFFTAKE_BENCH_SERVICE"] = service_url
    argv = [sys.executable, "-m", "offtake.cli", "worker", "--pipeline", str(path)]
    argv += ["--metrics-port", "0", "--log-level", "WARNING"]
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
            elif now - progress_at > STALL_SECONDS:
                status = "stalled"
                break
            time.sleep(0.1)
        wall = time.monotonic() - began
    finally:
        codes = [p.stop()[0] for p in processes]
    keys, times = read_keys_and_times(broker.bootstrap, output)
    check = verify_output(records, keys)
    rate = middle_rate(times)
    broker.delete_topic(output, missing_ok=True)
    broker.delete_topic(source, missing_ok=True)
    if status == "ok" and not check.complete:
        status = "incomplete"
    return {
        "contender": name,
        "workers": workers,
        "records": records,
        "status": status,
        "records_per_second": None if rate is None else round(rate, 1),
        "wall_seconds": round(wall, 2),
        "duplicates": check.duplicates,
        "missing": check.missing,
        "exit_codes": codes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--function", choices=FUNCTIONS, default="wait", help="(wait)")
    parser.add_argument("--workers", default="1,2,4,8", help="queue-mode worker counts (1,2,4,8)")
    parser.add_argument("--latency-ms", type=float, default=50.0, help="wait: (50)")
    parser.add_argument("--records-per-worker", type=int, default=300, help="wait: (300)")
    parser.add_argument("--max-poll-records", type=int, default=10, help="wait: (10)")
    parser.add_argument("--record-locks", type=int, default=100, help="wait: (100)")
    parser.add_argument("--records", type=int, default=60_000, help="cpu: records (60,000)")
    parser.add_argument("--json", type=Path, help="where to write the figures")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.workers.split(",")]
    plan = Plan(
        args.function,
        args.latency_ms,
        args.records_per_worker,
        args.max_poll_records,
        args.record_locks,
        args.records,
    )
    stamp = datetime.datetime.now(datetime.UTC)
    suffix = "" if plan.function == "wait" else f"-{plan.function}"
    out_path = args.json or BENCH / "results" / f"queue-scaling{suffix}-{stamp:%Y-%m-%d}.json"
    from offtake_testbed.kafka import KAFKA_VERSION, KafkaBroker
    from offtake_testbed.latency_service import LatencyService

    work = Path(tempfile.mkdtemp(prefix="offtake-bench-queue-scaling-"))
    load_at_start = os.getloadavg()[0]
    started = time.monotonic()
    results: list[dict[str, Any]] = []
    try:
        with KafkaBroker() as broker, LatencyService(plan.latency_ms) as service:
            url = service.url if plan.function == "wait" else None
            watcher = Watcher(broker.bootstrap)
            try:
                for name, n in contenders(plan, counts):
                    got = run(broker, watcher, plan, name, n, url, work)
                    results.append(got)
                    log(
                        f"{name:<13} x{n}  {got['records_per_second'] or 0:>10,.1f} records/s  "
                        f"{got['status']}  dups {got['duplicates']}  missing {got['missing']}"
                    )
            finally:
                watcher.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    linearity(results, plan.latency_ms if plan.function == "wait" else None)
    workload = (
        f"wait: one call per record to the latency service answering after "
        f"{plan.latency_ms:g} ms (concurrency_calls:offtake_sync), input topic of 1 partition"
        if plan.function == "wait"
        else "cpu-p1 (bench_workloads.offtake_burn), input topic of 1 partition"
    )
    report = {
        "date": stamp.isoformat(timespec="seconds"),
        "kafka_version": KAFKA_VERSION,
        "cpus": os.cpu_count(),
        "load_average_1m": {"start": round(load_at_start, 2), "end": round(os.getloadavg()[0], 2)},
        "seconds": round(time.monotonic() - started),
        "workload": workload,
        "plan": asdict(plan),
        "throughput_measure": (
            "the middle 80% of distinct output records / their span of log-append times"
        ),
        "runs": results,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"\n{workload}; load {load_at_start:.1f} -> "
        f"{report['load_average_1m']['end']} on {os.cpu_count()} CPUs"
    )
    print(
        f"{'contender':<15} {'workers':>7} {'records/s':>10} {'x 1 consumer':>12} "
        f"{'x linear':>9} {'x ideal':>8} {'dups':>6}"
    )
    for r in results:
        x = "-" if r["x_consumer_group"] is None else f"{r['x_consumer_group']:.2f}"
        lin = "-" if r.get("x_linear") is None else f"{r['x_linear']:.2f}"
        ideal = "-" if r.get("x_ideal") is None else f"{r['x_ideal']:.2f}"
        print(
            f"{r['contender']:<15} {r['workers']:>7} {r['records_per_second'] or 0:>10,.1f} "
            f"{x:>12} {lin:>9} {ideal:>8} {r['duplicates']:>6}  {r['status']}"
        )
    print(f"\nfigures: {out_path}  ({report['seconds']}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
