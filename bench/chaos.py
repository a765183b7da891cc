"""Reliability under faults and bad input: every chaos scenario at full size, one table.

    python bench/chaos.py [--quick] [--only 1,2,...] [--out docs/reliability.md] [--json PATH]

Runs each scenario of issue 17 on real components started by the test bed (a Kafka broker and
a three-broker KRaft cluster from the Maven Central jars, the real kube-apiserver, etcd and
controller-manager from the Go module proxy, real ``offtake worker`` and ``offtake-operator``
processes, the reference sidecar), bounded in time, and writes docs/reliability.md: scenario,
records, faults injected, records lost, records duplicated, time to recover, peak RSS where
memory is the question. The scenario bodies are tests/support/chaos/ (one module a scenario,
numbered as below), the same ones the short variants in tests/chaos/ run in the default suite
with smaller sizes.

1. three workers, 500,000 records, a random worker SIGKILLed every few seconds and restarted;
2. the three-broker cluster: the input's leading broker SIGKILLed and brought back, then all
   brokers restarted together, under two running workers that are never restarted;
3. the sink unavailable for a minute: the Kafka sink's brokers unreachable (frozen with
   SIGSTOP), PostgreSQL stopped under the JDBC Spark sink, the Spark Connect server SIGKILLed
   and started again under a connect-mode Spark sink: peak RSS against
   ``limits.maxInFlightBytes``, nothing dead-lettered, work resumes;
4. the operator SIGKILLed while reconciling 100 pipelines (some scaled, some deleted while it
   is down): all converge, no child duplicated or orphaned;
5. bad input: fuzzed payloads in every source format (avro, protobuf and jsonschema against
   the test bed's Apicurio Registry), records larger than the output's ``max.message.bytes``,
   a processor that raises or returns an unsendable value, one that hangs (bounded by
   ``processor.timeoutSeconds``), one that leaks memory (recycled past
   ``processor.maxMemoryMiB``), and hypothesis-generated manifests against ``offtake
   validate`` and the operator;
6. the sidecar processor SIGKILLed, then frozen: not ready meanwhile, nothing committed past
   the output, nothing dead-lettered, resumes.

"Time to recover" is the longest time, over a scenario's faults, from the fault (or from the
end of an outage) until the group's committed offsets move again. Duplicates are bounded by
the faults times ``limits.maxInFlightMessages`` (a killed worker re-delivers at most what it
had in flight). A scenario that raises is a row that says FAILED and why; the exit code is 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the scenario bodies: tests/support/chaos/

from spark.connect_server import ConnectServer  # noqa: E402
from support import cgroups  # noqa: E402
from support.chaos import (  # noqa: E402
    s01_worker_kills,
    s02_broker_failover,
    s03_sink_outages,
    s04_operator_kills,
    s05_bad_input,
    s06_sidecar_outages,
)
from support.chaos.common import Outcome  # noqa: E402
from support.schemas import FORMATS as SCHEMA_FORMATS  # noqa: E402

from offtake_testbed.apicurio import ApicurioRegistry  # noqa: E402
from offtake_testbed.kafka import KafkaBroker  # noqa: E402
from offtake_testbed.kafka_cluster import KafkaCluster  # noqa: E402
from offtake_testbed.postgres import PostgresServer  # noqa: E402

FULL = {
    "kills": {"records": 500_000, "kills": 15, "every": 4.0},
    "brokers": {"records": 200_000, "outage": 20.0},
    "sink": {
        "kafka": {"records": 300_000, "outage": 60.0},
        "jdbc": {"records": 100_000, "outage": 60.0},
        "connect": {"records": 100_000, "outage": 60.0},
    },
    "operator": {"pipelines": 100, "kills": 3, "every": 2.0},
    "fuzz": {"count": 5_000, "examples": 1_000, "hangs": 10, "leak_kib": 256},
    "sidecar": {"records": 20_000, "outage": 30.0},
}
QUICK = {
    "kills": {"records": 10_000, "kills": 2, "every": 3.0},
    "brokers": {"records": 6_000, "outage": 3.0, "full_restart": False},
    "sink": {
        "kafka": {"records": 20_000, "outage": 6.0},
        "jdbc": {"records": 5_000, "outage": 15.0},
        "connect": {"records": 5_000, "outage": 10.0},
    },
    "operator": {"pipelines": 20, "kills": 1, "every": 1.5},
    "fuzz": {"count": 600, "examples": 150, "hangs": 3, "leak_kib": 1024},
    "sidecar": {"records": 3_000, "outage": 5.0},
}


class Beds:
    """The components, started on first use and stopped at the end."""

    def __init__(self) -> None:
        self.broker: KafkaBroker | None = None
        self.cluster: KafkaCluster | None = None
        self.control_plane: Any = None
        self.registry: ApicurioRegistry | None = None

    def kafka(self) -> KafkaBroker:
        if self.broker is None:
            self.broker = KafkaBroker().start()
        return self.broker

    def kafka_cluster(self) -> KafkaCluster:
        if self.cluster is None:
            self.cluster = KafkaCluster().start()
        return self.cluster

    def schema_registry(self) -> ApicurioRegistry:
        if self.registry is None:
            self.registry = ApicurioRegistry().start()
        return self.registry

    def kube(self) -> Any:
        if self.control_plane is None:
            from offtake_testbed.kube import KUBE_VERSION, ControlPlane, install_control_plane

            paths = install_control_plane(KUBE_VERSION, progress=sys.stderr)
            self.control_plane = ControlPlane(paths).start()
            s04_operator_kills.apply_crd(self.control_plane)
        return self.control_plane

    def stop(self) -> None:
        for part in (self.broker, self.cluster, self.control_plane, self.registry):
            if part is not None:
                part.stop()


def scenario_kills(beds: Beds, work: Path, size: dict[str, Any]) -> list[Outcome]:
    return [s01_worker_kills.worker_kills(beds.kafka(), work, **size)]


def scenario_brokers(beds: Beds, work: Path, size: dict[str, Any]) -> list[Outcome]:
    return [s02_broker_failover.broker_failover(beds.kafka_cluster(), work, **size)]


def scenario_sink(beds: Beds, work: Path, size: dict[str, Any]) -> list[Outcome]:
    cluster = beds.kafka_cluster()
    pids = [cluster.node_pid(n) for n in cluster.node_ids]
    rows = [s03_sink_outages.sink_broker_outage(beds.kafka(), cluster, pids, work, **size["kafka"])]
    # The Spark halves get a PostgreSQL and a Spark Connect server of their own: both are
    # taken down on purpose.
    with PostgresServer() as postgres:
        target = s03_sink_outages.PostgresDown(postgres)
        rows.append(s03_sink_outages.spark_sink_outage(beds.kafka(), work, target, **size["jdbc"]))
    connect = ConnectServer(conf={"spark.sql.shuffle.partitions": "2"}).start()
    try:
        killed = s03_sink_outages.ConnectKilled(connect, work / "connect-table")
        rows.append(
            s03_sink_outages.spark_sink_outage(
                beds.kafka(), work, killed, restart_on_exit=True, **size["connect"]
            )
        )
    finally:
        connect.stop()
    return rows


def scenario_operator(beds: Beds, work: Path, size: dict[str, Any]) -> list[Outcome]:
    kube = beds.kube()
    namespace = f"chaos-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", namespace)
    try:
        return [s04_operator_kills.operator_kills(kube, namespace, work, **size)]
    finally:
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


PLAIN_FORMATS = ("json", "string", "bytes")


def scenario_bad_input(beds: Beds, work: Path, size: dict[str, Any]) -> list[Outcome]:
    broker, count = beds.kafka(), size["count"]
    rows = [s05_bad_input.fuzzed_format(broker, work, fmt, count, seed=17) for fmt in PLAIN_FORMATS]
    registry = beds.schema_registry()
    rows += [
        s05_bad_input.fuzzed_schema_format(
            broker, work, fmt, count, seed=17, registry_url=registry.url
        )
        for fmt in SCHEMA_FORMATS
    ]
    rows.append(s05_bad_input.oversize_records(broker, work, count))
    rows.append(s05_bad_input.failing_processor(broker, work, count))
    rows.append(s05_bad_input.hung_processor(broker, work, count, hangs=size["hangs"]))
    rows.append(s05_bad_input.leaking_processor(broker, work, count, leak_kib=size["leak_kib"]))
    no_cgroup = cgroups.unavailable()
    if no_cgroup is None:
        # At least 3,000 records: 128 KiB kept per record must outgrow the 256 MiB limit.
        oom_count = max(3_000, 2 * count)
        rows.append(
            s05_bad_input.leak_under_memory_limit(broker, work, oom_count, seconds=oom_count / 500)
        )
    else:
        print(f"skipped the OOM-killed worker: {no_cgroup}", flush=True)
    rows.append(_manifests(size))
    return rows


def _manifests(size: dict[str, Any]) -> Outcome:
    """The hypothesis tests of tests/chaos/test_bad_manifests.py with more examples."""
    env = {**os.environ, "OFFTAKE_CHAOS_EXAMPLES": str(size["examples"])}
    began = time.monotonic()
    done = subprocess.run(
        [
            # The venv's pytest script, not "python -m pytest": with the repository as the
            # working folder, -m would put operator/ in front of the standard library.
            str(Path(sys.executable).parent / "pytest"),
            "-p",
            "no:cacheprovider",
            "-q",
            str(REPO / "tests" / "chaos" / "test_bad_manifests.py"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    tail = done.stdout.strip().splitlines()[-1:] or ["(no output)"]
    if done.returncode != 0:
        raise AssertionError(f"bad-manifest tests failed: {done.stdout[-3000:]}")
    examples = size["examples"]
    return Outcome(
        "5. hypothesis manifests: offtake validate and the operator",
        2 * examples,
        f"{examples} broken manifests each for validate and the operator, plus 6 non-manifests",
        2 * examples,
        0,
        0,
        0,
        time.monotonic() - began,
        notes=[f"never a traceback, exit 2 naming the field every time ({tail[0]})"],
    )


def scenario_sidecar(beds: Beds, work: Path, size: dict[str, Any]) -> list[Outcome]:
    return [s06_sidecar_outages.sidecar_outages(beds.kafka(), work, **size)]


SCENARIOS: dict[str, tuple[str, Callable[[Beds, Path, dict[str, Any]], list[Outcome]]]] = {
    "1": ("kills", scenario_kills),
    "2": ("brokers", scenario_brokers),
    "3": ("sink", scenario_sink),
    "4": ("operator", scenario_operator),
    "5": ("fuzz", scenario_bad_input),
    "6": ("sidecar", scenario_sidecar),
}


def _cell(value: float | None, unit: str = "s") -> str:
    if value is None:
        return "n/a"
    if value == float("inf"):
        return "never"
    return f"{value:.1f} {unit}"


def render(rows: list[dict[str, Any]], args: argparse.Namespace, took: float) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Reliability under faults and bad input",
        "",
        "Written by `python bench/chaos.py` (see its docstring; `--quick` runs the sizes of the",
        "short variants in `tests/chaos/`, which the default suite runs). Every scenario runs on",
        "real components: Apache Kafka from the Maven Central jars (one broker, and a three-broker",
        "KRaft cluster with replication factor 3 and `min.insync.replicas=2`), the real",
        "kube-apiserver, etcd and controller-manager, real `offtake worker` and",
        "`offtake-operator` processes, the reference sidecar processor. Nothing is simulated.",
        "",
        f"Last run: {when}, {'quick' if args.quick else 'full'} sizes, {took / 60:.1f} minutes,",
        f"on {platform.machine()} with {os.cpu_count()} cores shared with other jobs running at",
        "the same time (times to recover are upper bounds on a loaded machine).",
        *(
            [
                f"Scenario(s) {args.only} were rerun after a fix; the other rows are from the run",
                f"before it ({args.keep}).",
            ]
            if args.keep
            else []
        ),
        "",
        "| scenario | records | faults injected | lost | duplicated (bound) "
        "| time to recover | peak RSS |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['scenario']} | n/a | n/a | FAILED | n/a | n/a | n/a |")
            continue
        lines.append(
            f"| {r['scenario']} | {r['records']:,} | {r['faults']} | {r['lost']} "
            f"| {r['duplicated']} ({r['duplicate_bound']}) | {_cell(r['recover_seconds'])} "
            f"| {_cell(r['peak_rss_mib'], 'MiB')} |"
        )
    lines += [
        "",
        "Lost: records of the input missing from the output (scenario 4: children left without",
        "their pipeline; scenario 5: records neither delivered nor dead-lettered). Duplicated:",
        "extra copies in the output (scenario 4: extra children), with the bound the scenario",
        "allows in brackets: faults x `limits.maxInFlightMessages` for killed workers, 0 where",
        "nothing is killed. Dead-lettering is the expected outcome of bad payloads and failing",
        "processors (scenario 5) and never of an outage (scenarios 3 and 6, checked).",
        "",
        "## Notes of this run",
        "",
    ]
    for r in rows:
        for note in r.get("notes") or []:
            lines.append(f"- {r['scenario']}: {note}")
        if "error" in r:
            lines.append(f"- {r['scenario']}: FAILED: {r['error']}")
    lines += [
        "",
        "## Bugs these scenarios found (fixed, each with a focused test)",
        "",
        "- Scenario 2: a partition paused under backpressure, lost when its broker died and",
        "  assigned again stayed paused for good (librdkafka keeps a pause across rebalances);",
        "  the workers were alive, idle and the group stuck. Newly assigned partitions are now",
        "  resumed unless the worker itself holds them paused (`PartitionPauser.fresh`).",
        "- Scenario 6: the worker answered `/readyz` 200 while its sidecar was down; it now",
        '  answers 503 ("processor unavailable: ...") until the sidecar answers again.',
        "- Scenario 3: a Spark sink whose database or Spark Connect server was down",
        "  dead-lettered every record of the outage (connection refused, or the restarted",
        "  server's NO_ACTIVE_SESSION, spent `errors.maxRetries` within a second). An",
        "  unreachable sink is now an outage the sink waits out without spending attempts",
        "  (backoff up to 5 s, backpressure meanwhile), and a Connect session the server",
        "  forgot is replaced; the Connect client's own retries back off at most 5 s (not 60).",
        "- Scenario 3, Spark Connect: the worker reached the restarted server 58.7 s after it",
        "  listened again (the other sinks 1.6-4.5 s). Not the sink's backoff (5 s at most) nor",
        "  the session: gRPC's own reconnect backoff (1 s, x1.6 per failed connect, up to",
        "  120 s) had grown over the minute the server was dead, and the channel failed every",
        "  call at once until its timer ran out. Measured on a server SIGKILLed for 60 s: the",
        "  first call to reach the restarted server came 46.8 s after it listened, 5.6 s with",
        "  the channel's reconnect backoff capped at 5 s (now set). The row above (36.0 s) has",
        "  that fix. After it the sink no longer waits its outage backoff once the server has",
        "  answered (NO_ACTIVE_SESSION: it restarted), and a short run (server killed for 10 s)",
        "  shows where the rest goes: server listening at 22:20:26, the client's next retry",
        "  reached it 6.5 s later, the new session took 0.1 s, and the first write job on the",
        "  fresh server JVM finished 12 s after that (Spark's cold start: class loading, code",
        "  generation, on a loaded machine), 20.4 s in all; later jobs took ~2 s each.",
        "- Scenario 5: `processor.timeoutSeconds` applied only to sidecars, so a function that",
        "  hung held its partition for good, and `processor.parallelism`'s pool",
        "  (`multiprocessing.Pool`) never returned from a batch whose process died. Function",
        "  processors now take `timeoutSeconds` and `maxMemoryMiB` and run, when either is set,",
        "  in Offtake's own pool, which kills and replaces a process whose call runs past the",
        "  timeout or that dies (that record's error) and replaces one past the memory bound",
        "  between two calls.",
        "- Scenario 5: a processor returning an object JSON cannot hold had its `str()`",
        "  (`<Foo object at 0x...>`) sent as the record; it is now an error of that record, to",
        "  the error policy. Manifests: an integer beyond 64 bits and `config:` left empty",
        "  (null) crashed `offtake validate` with a traceback inside cel-python; keys with",
        "  control characters were printed raw in a problem's field path; the operator met",
        '  `spec.template: true` with its catch-all ("spec: cannot be read: AttributeError").',
        "",
        "## What each scenario does",
        "",
        "See `bench/chaos.py` and `tests/support/chaos/` (one module a scenario, `s01_*.py`",
        "... `s06_*.py`). Scenario 3's peak RSS is the worker's",
        "own process; in the JDBC row its Spark driver JVM (local mode) is a child process",
        "whose heap `spark.driver.memory` bounds, not counted. The Connect row's time to recover",
        "counts from when the restarted server listened again. Scenario 5's hung processor:",
        "`processor.timeoutSeconds: 1`, two pool processes, one retry, so each hung record costs",
        "two killed calls; its time column is until the group had committed every record. The",
        "leaking processor's peak RSS is the highest seen (sampled every 50 ms) of a pool",
        "process, against `processor.maxMemoryMiB: 128`; its fault count is the processes",
        "replaced. The schema'd formats' fuzz decodes against the test bed's Apicurio Registry.",
        "Without `timeoutSeconds`/`maxMemoryMiB` a function runs in the worker's thread: a hang",
        "holds its partition and a leak ends with the pod's memory limit. The row 'leaks in the",
        "worker's thread' shows that end on the kernel's own limit: the worker runs in a memory",
        "cgroup (what a pod's `resources.limits.memory` becomes), the kernel's OOM killer ends",
        "it (counted from the cgroup's `oom_kill`), it is started again as the kubelet would",
        "and resumes from its last commit; its fault count is the OOM kills, its duplicate",
        "bound kills x `limits.maxInFlightMessages` (500).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the short variants' sizes")
    parser.add_argument("--only", default="", help="scenario numbers, e.g. 1,3")
    parser.add_argument("--out", default=str(REPO / "docs" / "reliability.md"))
    parser.add_argument("--json", default="", help="also write the rows as JSON here")
    parser.add_argument(
        "--keep",
        default="",
        help="rows (--json of an earlier run) to keep for the scenarios not run this time",
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    chosen = [s.strip() for s in args.only.split(",") if s.strip()] or list(SCENARIOS)
    beds = Beds()
    rows: list[dict[str, Any]] = []
    began = time.monotonic()
    failed = False
    try:
        for number in chosen:
            key, run = SCENARIOS[number]
            print(f"scenario {number} ({key}) ...", flush=True)
            t0 = time.monotonic()
            with tempfile.TemporaryDirectory(prefix=f"offtake-chaos-{key}-") as work:
                try:
                    for outcome in run(beds, Path(work), sizes[key]):
                        outcome.check()
                        rows.append(asdict(outcome))
                        print(f"  {json.dumps(asdict(outcome))}", flush=True)
                except Exception as exc:
                    failed = True
                    traceback.print_exc()
                    rows.append({"scenario": f"{number}. {key}", "error": str(exc)[:500]})
            print(f"  scenario {number} took {time.monotonic() - t0:.0f}s", flush=True)
    finally:
        beds.stop()
    if args.keep:
        kept = json.loads(Path(args.keep).read_text())
        rows = [r for r in kept if r["scenario"].split(".")[0] not in chosen] + rows
        rows.sort(key=lambda r: int(r["scenario"].split(".")[0]))
    text = render(rows, args, time.monotonic() - began)
    Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
