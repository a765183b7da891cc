"""Kafka to Kafka, at least once: Offtake against the libraries a user would choose instead.

    python bench/passthrough.py [--quick] [--records N] [--rounds N] [--only C,C] [--json PATH]

One command, one real Apache Kafka broker (offtake_testbed.kafka), the same input data for
every contender, each run as its own process:

- ``c``: a librdkafka forwarder in C (bench/forwarder.c), a ceiling without Python: consume
  a batch, produce each, flush, commit synchronously (the bench's earlier loop, in C). Built
  at run time into the cache from Debian's librdkafka-dev (installed with apt-get when missing
  and allowed); skipped with a printed reason when that fails. Pass-through only;
- ``loop``: the careful confluent-kafka loop an experienced user writes by hand (issue 24):
  ``consume(1000)``, orjson for JSON, produce each, ``flush()``, then an asynchronous commit of
  the batch's offsets;
- ``quix``: Quix Streams, ``app.dataframe(topic).to_topic(out)``, at-least-once;
- ``arroyo``: Sentry's Arroyo, Produce then CommitOffsets (RunTask, or
  RunTaskWithMultiprocessing for parallelism 2, in front);
- ``offtake``: ``offtake worker --pipeline X.yaml`` (``format: bytes`` and a Kafka sink, or the
  workload's ``processor.function``), driven only through its CLI, so the bench measures
  whatever engine the checkout holds.

Quix Streams and Arroyo are pinned and installed once into virtualenvs outside the repository
(``$OFFTAKE_CACHE/bench-venvs``, default ~/.cache/offtake); the loop and Offtake use this
environment's confluent-kafka. The contenders' Python code is bench/bench_contenders.py; the
per-record functions, shared by all of them, bench/bench_workloads.py.

Workloads: ``bytes`` (pass-through), ``json`` (parse, change and re-serialise each record),
``cpu-p1`` and ``cpu-p2`` (a fixed amount of hashing per record in 1 or 2 processes: Offtake's
``processor.parallelism``, Arroyo's RunTaskWithMultiprocessing; the loop and Quix Streams run
one process only and show "n/a"). Input: ~80-byte JSON records with unique keys, 4 partitions.

What is measured:

- throughput is steady state: the output topic stamps each record with its log-append time,
  and a run's rate is its distinct output records divided by the time from its FIRST to its
  LAST output record, so process start-up and group join are not charged. Best of ``--rounds``
  rounds; each round runs the contenders in the opposite order of the previous one;
- every run's output is read back and checked: every input key present (at-least-once, so
  duplicates are allowed and reported), and the group's committed offsets at the input's end
  after the contender stopped gracefully (SIGTERM);
- latency: a fresh topic, the contender started and warmed up (its first records forwarded),
  then records offered at a fixed 10,000/s; latency is the output record's log-append time
  minus the wall-clock time the bench produced it (same host, same clock), p50/p99/max.

This machine is shared (2 cores, other jobs running): absolute records/s move from run to run
by tens of percent. Read the ratios against the anchors measured in the same run (the loop,
Quix Streams, Arroyo), not the absolute figures. The figures go to
bench/results/passthrough-<date>.json (or ``--json``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaException,
    Producer,
    TopicPartition,
)

BENCH = Path(__file__).resolve().parent
PARTITIONS = 4
VALUE_BYTES = 80
CONTENDERS = (
    "c",
    "loop",
    "loop-queue",
    "quix",
    "arroyo",
    "offtake",
    "offtake-eos",
    "offtake-queue",
    "offtake-base",
    "offtake-queue-base",
)
# "offtake": exactly-once (offtake-eos) and queue mode on a share group (offtake-queue) read
# against at-least-once on a consumer group in the same run; "loop-queue": the hand-written
# loop on a share group (bench_contenders.py), queue mode's own anchor.
ANCHORS = ("loop", "quix", "arroyo", "offtake", "loop-queue")
QUEUE_CONTENDERS = ("offtake-queue", "offtake-queue-base", "loop-queue")
# Pinned, so that a figure names what it measured; the versions of the issue's first table.
VENV_PACKAGES = {"quix": "quixstreams==3.28.1", "arroyo": "sentry-arroyo==2.48.0"}
LATENCY_RATE = 10_000
# --baseline DIR: another checkout whose worker runs as "offtake-base" (before/after in one run),
# and in queue mode as "offtake-queue-base".
BASELINES = ("offtake-base", "offtake-queue-base")
BASELINE: Path | None = None
# --profile DIR: where py-spy writes the Offtake runs' profiles (None: not profiled).
PROFILE_DIR: Path | None = None
# --cpus LIST: every contender's process held to these CPUs (taskset -c), so that a run shows
# the rate where the CPU is the limit (issue 42: CPU per record is what holds on every machine).
PINNED: str | None = None
WARMUP_RECORDS = 100
COST_ROUNDS = 5  # per_record_costs: best of


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # bytes | json | cpu: which function bench_workloads applies
    parallelism: int
    share: float  # records of this workload per pass-through record (--records)


WORKLOADS = (
    Workload("bytes", "bytes", 1, 1.0),
    # More records than pass-through for the fast loops: --quick's 25,000 JSON records were over
    # in 0.6 s for the loop, too short a window to trust (2026-11-26).
    Workload("json", "json", 1, 3.0),
    # json's enrich on values in the schema registry wire format, registry on both sides.
    Workload("avro", "avro", 1, 0.8),
    Workload("protobuf", "protobuf", 1, 0.5),
    Workload("jsonschema", "jsonschema", 1, 0.4),
    Workload("cpu-p1", "cpu", 1, 0.1),
    Workload("cpu-p2", "cpu", 2, 0.1),
)
SCHEMA_KINDS = ("avro", "protobuf", "jsonschema")


# -- the check every run's output gets --------------------------------------------------------
@dataclass(frozen=True)
class OutputCheck:
    """What a contender wrote, against the input's keys ``b"0"`` .. ``b"<expected-1>"``."""

    records: int  # output records, duplicates included
    unique: int  # distinct input keys found in the output
    duplicates: int  # output records beyond the first of their key
    missing: int  # input keys never written
    unexpected: int  # distinct keys that are not input keys

    @property
    def complete(self) -> bool:
        """At least once: every input record written, nothing else (duplicates allowed)."""
        return self.missing == 0 and self.unexpected == 0


def verify_output(expected: int, keys: Iterable[bytes | None]) -> OutputCheck:
    counts = Counter(keys)
    want = {b"%d" % i for i in range(expected)}
    seen = set(counts)
    found = len(seen & want)
    return OutputCheck(
        records=sum(counts.values()),
        unique=found,
        duplicates=sum(counts.values()) - len(seen),
        missing=expected - found,
        unexpected=len(seen - want),
    )


def steady_rate(unique: int, times_ms: Sequence[int]) -> float | None:
    """Records per second from the first output record's log-append time to the last's."""
    if unique < 2 or not times_ms:
        return None
    span = (max(times_ms) - min(times_ms)) / 1000
    return unique / span if span > 0 else None


def cpu_between(samples: Sequence[tuple[float, float]], start_ms: int, end_ms: int) -> float | None:
    """CPU seconds a process used from ``start_ms`` to ``end_ms`` (wall-clock ms, the output's
    log-append times), from its (wall ms, CPU seconds) samples: those just outside the window."""
    before = [cpu for at, cpu in samples if at <= start_ms]
    after = [cpu for at, cpu in samples if at >= end_ms]
    if not before or not after:
        return None
    return after[0] - before[-1]


def _thread_samples(pid: int, tick: int) -> dict[str, tuple[str, float, int]]:
    """Each live thread of a process: thread id -> (name, CPU seconds, context switches, both
    voluntary and not)."""
    out: dict[str, tuple[str, float, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "stat").read_text()
            status = (task / "status").read_text().splitlines()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rpartition(")")[2].split()
        switches = sum(
            int(line.split()[1])
            for line in status
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))
        )
        out[task.name] = (name, (int(fields[11]) + int(fields[12])) / tick, switches)
    return out


def by_name(threads: dict[str, tuple[str, float]]) -> dict[str, float]:
    """Threads' CPU seconds summed by name, broker threads (rdk:broker<n>) as one."""
    out: dict[str, float] = {}
    for name, cpu in threads.values():
        short = name.rstrip("0123456789") if name.startswith("rdk:broker") else name
        out[short] = out.get(short, 0.0) + cpu
    return {name: round(cpu, 2) for name, cpu in sorted(out.items(), key=lambda i: -i[1])}


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence."""
    rank = max(1, min(len(sorted_values), math.ceil(q / 100 * len(sorted_values))))
    return sorted_values[rank - 1]


# -- environments ---------------------------------------------------------------------------
def cache_root() -> Path:
    return Path(os.environ.get("OFFTAKE_CACHE", Path.home() / ".cache" / "offtake"))


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Unavailable(Exception):
    """A contender cannot run here; the message says why (printed, and kept in the JSON)."""


def venv_python(requirement: str) -> Path:
    """A virtualenv with ``requirement`` outside the repository, created once and reused."""
    venv = cache_root() / "bench-venvs" / requirement.replace("==", "-")
    python = venv / "bin" / "python"
    marker = venv / ".offtake-bench-ready"
    if marker.exists():
        return python
    log(f"creating {venv} with {requirement} (once)")
    shutil.rmtree(venv, ignore_errors=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", requirement],
            check=True,
            timeout=900,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        raise Unavailable(f"could not install {requirement} into {venv}: {exc}") from exc
    marker.write_text(requirement + "\n")
    return python


def forwarder_binary() -> tuple[Path, str]:
    """bench/forwarder.c built against the system's librdkafka; (binary, librdkafka version)."""
    if shutil.which("gcc") is None:
        raise Unavailable("no gcc on PATH")
    if not _pkg_config_has_rdkafka():
        if shutil.which("apt-get") is None or os.geteuid() != 0:
            raise Unavailable("librdkafka-dev missing (apt-get install librdkafka-dev)")
        log("installing librdkafka-dev with apt-get for the C forwarder (once)")
        done = subprocess.run(
            ["apt-get", "install", "-y", "-q", "librdkafka-dev"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0 or not _pkg_config_has_rdkafka():
            raise Unavailable(f"apt-get install librdkafka-dev failed: {done.stderr[-300:]}")
    version = _pkg_config("--modversion", "rdkafka").strip()
    source = BENCH / "forwarder.c"
    import hashlib

    digest = hashlib.sha256(source.read_bytes() + version.encode()).hexdigest()[:12]
    binary = cache_root() / "bench-build" / f"forwarder-{digest}"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        flags = _pkg_config("--cflags", "--libs", "rdkafka").split()
        tmp = binary.with_suffix(".tmp")
        done = subprocess.run(
            ["gcc", "-O2", "-o", str(tmp), str(source), *flags],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise Unavailable(f"gcc failed: {done.stderr[-500:]}")
        tmp.rename(binary)
    return binary, version


def _pkg_config_has_rdkafka() -> bool:
    if shutil.which("pkg-config") is None:
        return False
    return subprocess.run(["pkg-config", "--exists", "rdkafka"], check=False).returncode == 0


def _pkg_config(*args: str) -> str:
    return subprocess.run(["pkg-config", *args], capture_output=True, text=True, check=True).stdout


@dataclass
class Contenders:
    """How to start each contender that can run here, and why the others cannot."""

    pythons: dict[str, Path] = field(default_factory=dict)
    forwarder: Path | None = None
    versions: dict[str, str] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)


def prepare(wanted: Sequence[str]) -> Contenders:
    import importlib.metadata

    import confluent_kafka

    out = Contenders()
    out.versions["confluent-kafka (loop, offtake)"] = importlib.metadata.version("confluent-kafka")
    out.versions["librdkafka (loop, offtake)"] = confluent_kafka.libversion()[0]
    for name in wanted:
        try:
            if name in BASELINES and BASELINE is None:
                raise Unavailable("give --baseline DIR (another checkout) to run it")
            if name == "c":
                out.forwarder, version = forwarder_binary()
                out.versions["librdkafka (c, system)"] = version
            elif name in VENV_PACKAGES:
                requirement = VENV_PACKAGES[name]
                python = venv_python(requirement)
                out.pythons[name] = python
                out.versions[requirement.split("==")[0]] = requirement.split("==")[1]
                out.versions[f"confluent-kafka ({name})"] = _venv_version(python, "confluent-kafka")
        except Unavailable as exc:
            out.unavailable[name] = str(exc)
            log(f"skipping {name}: {exc}")
    return out


def _venv_version(python: Path, package: str) -> str:
    return subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


# -- starting a contender ---------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    bootstrap: str
    input: str
    output: str
    group: str
    workload: Workload
    registry: str | None = None  # the schema registry's URL (schema'd workloads)


def command(
    name: str, job: Job, contenders: Contenders, work: Path
) -> tuple[list[str], dict[str, str]]:
    """argv and environment of contender ``name`` for ``job``, held to ``--cpus`` if given."""
    argv, env = _command(name, job, contenders, work)
    return (argv if PINNED is None else ["taskset", "-c", PINNED, *argv]), env


def _command(
    name: str, job: Job, contenders: Contenders, work: Path
) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    if name == "c":
        assert contenders.forwarder is not None
        return [str(contenders.forwarder), job.bootstrap, job.input, job.output, job.group], env
    if name in ("offtake", "offtake-eos", "offtake-queue", *BASELINES):
        manifest = work / f"{job.group}.yaml"
        # JSON is YAML: no YAML library needed to write the manifest.
        doc = offtake_manifest(
            job,
            work,
            exactly_once=name == "offtake-eos",
            queue=name in ("offtake-queue", "offtake-queue-base"),
        )
        manifest.write_text(json.dumps(doc, indent=2))
        # offtake-base: the worker of the --baseline checkout instead of this one's.
        base = BASELINE
        ours = str(base / "worker") if name in BASELINES and base else env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (ours, str(BENCH)) if p)
        argv = [sys.executable, "-m", "offtake.cli", "worker", "--pipeline", str(manifest)]
        return [*argv, "--metrics-port", "0", "--log-level", "WARNING"], env
    python = contenders.pythons.get(name, Path(sys.executable))
    if name in VENV_PACKAGES:
        env.pop("PYTHONPATH", None)  # the venv's own packages only
    argv = [str(python), str(BENCH / "bench_contenders.py"), name]
    argv += ["--bootstrap", job.bootstrap, "--input", job.input, "--output", job.output]
    argv += ["--group", job.group, "--workload", job.workload.kind]
    if job.registry is not None:
        argv += ["--registry", job.registry]
    return [*argv, "--parallelism", str(job.workload.parallelism)], env


def offtake_manifest(
    job: Job, work: Path, exactly_once: bool = False, queue: bool = False
) -> dict[str, Any]:
    kind = job.workload.kind
    spec: dict[str, Any] = {
        "kafka": {"bootstrapServers": job.bootstrap},
        "source": {
            "topics": [job.input],
            "groupId": job.group,
            "format": kind if kind in ("json", *SCHEMA_KINDS) else "bytes",
        },
        "sink": {"kafka": {"topic": job.output}},
    }
    if kind in SCHEMA_KINDS:
        # Registry on both sides: the output schema registered under the output topic's
        # subject at start, as the other contenders' serializers do on first use.
        import bench_schemas

        spec["source"]["schemaRegistry"] = {"url": job.registry}
        sink = spec["sink"]["kafka"]
        sink.update(format=kind, autoRegister=True)
        if kind == "protobuf":
            spec["source"]["protobufMessage"] = bench_schemas.PROTOBUF_IN
            sink["protobufMessage"] = bench_schemas.PROTOBUF_OUT
        else:
            schema_file = work / f"{job.group}-out.schema.json"
            schema_file.write_text(bench_schemas.SCHEMAS[kind][1])
            sink["schema"] = {"file": str(schema_file)}
    if exactly_once:
        spec["sink"]["kafka"]["delivery"] = "exactly-once"
    if queue:
        spec["source"]["groupType"] = "share"  # one worker, the same topic: the mode's cost
    if kind != "bytes":
        function = "offtake_burn" if kind == "cpu" else "offtake_enrich"
        spec["processor"] = {"function": f"bench_workloads:{function}"}
        if job.workload.parallelism > 1:
            spec["processor"]["parallelism"] = job.workload.parallelism
    return {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": "bench", "namespace": "bench"},
        "spec": spec,
    }


def supports(name: str, workload: Workload) -> str | None:
    """None when ``name`` runs ``workload``; else why not (shown as n/a)."""
    if name == "c" and workload.kind != "bytes":
        return "the C forwarder is the pass-through ceiling only"
    if name == "arroyo" and workload.kind in SCHEMA_KINDS:
        return "schema'd workloads: the loop, Quix Streams and Offtake"
    if name in ("loop", "loop-queue", "quix") and workload.parallelism > 1:
        return "runs its function in one process only"
    return None


class Process:
    """A contender's process, its output in a log file; stopped with SIGTERM, then SIGKILL."""

    def __init__(
        self, argv: list[str], env: dict[str, str], work: Path, label: str, profile: bool = False
    ) -> None:
        self.log_path = work / f"{label}.log"
        self._out = self.log_path.open("wb")
        # cwd outside the repository: its operator/ folder must not shadow anything, and Quix
        # Streams writes a state folder into its cwd.
        self.proc = subprocess.Popen(
            argv, stdout=self._out, stderr=subprocess.STDOUT, env=env, cwd=work
        )
        self._profiler: subprocess.Popen[bytes] | None = None
        if profile and PROFILE_DIR is not None:
            # py-spy attaches to the running worker and writes its profile when it exits:
            # collapsed stacks of the time the worker held the GIL (--gil), one file per run.
            self._profiler = subprocess.Popen(
                [
                    *(shutil.which("py-spy") or "py-spy", "record", "--gil", "--format", "raw"),
                    *("--rate", "250"),  # py-spy's 100/s gives a few hundred samples a run
                    *("-o", str(PROFILE_DIR / f"{label}.txt"), "--pid", str(self.proc.pid)),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

        # CPU time (all threads, user and system) over wall-clock time, for the CPU a record
        # cost: unlike records/s, it hardly moves with the other jobs on a shared machine.
        self.cpu_samples: list[tuple[float, float]] = []
        self.threads: dict[str, tuple[str, float]] = {}  # id: (name, CPU seconds) last seen
        # id: context switches last seen. How often a contender's threads sleep and wake: on a
        # shared machine each wake may take a CPU from a neighbour (the bench's producer).
        self.switches: dict[str, int] = {}
        self._sampling = threading.Thread(target=self._sample_cpu, daemon=True)
        self._sampling.start()

    def _sample_cpu(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        stat = Path(f"/proc/{self.proc.pid}/stat")
        while self.proc.poll() is None:
            try:
                fields = stat.read_text().rpartition(")")[2].split()
            except OSError:
                return
            # utime and stime: fields 14 and 15 of proc(5), 12 and 13 after the ")".
            cpu = (int(fields[11]) + int(fields[12])) / tick
            self.cpu_samples.append((time.time() * 1000, cpu))
            for tid, (name, used, switches) in _thread_samples(self.proc.pid, tick).items():
                self.threads[tid] = (name, used)
                self.switches[tid] = switches
            time.sleep(0.05)

    def exited(self) -> int | None:
        return self.proc.poll()

    def stop(self, timeout: float = 30.0) -> tuple[int, bool]:
        """(exit code, whether it had to be killed)."""
        killed = False
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
                killed = True
        self._out.close()
        if self._profiler is not None:
            self._profiler.wait(60)
        return self.proc.returncode, killed

    def tail(self, lines: int = 15) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


# -- Kafka helpers ----------------------------------------------------------------------------
def record_value(i: int) -> bytes:
    head = b'{"id":%d,"customer":"c%d","amount":%.2f,"pad":"' % (i, i % 97, (i % 5000) * 0.5)
    return head + b"x" * max(0, VALUE_BYTES - len(head) - 2) + b'"}'


def wire_encoder(kind: str, registry: str, topic: str) -> Any:
    """A JSON record's value -> the same record in ``kind``'s wire format, written by
    confluent-kafka's serializer (the input schema registered under the topic's subject)."""
    import bench_schemas
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry})
    ctx = SerializationContext(topic, MessageField.VALUE)
    if kind == "avro":
        from confluent_kafka.schema_registry.avro import AvroSerializer

        avro = AvroSerializer(client, bench_schemas.SCHEMAS["avro"][0])
        return lambda value: avro(json.loads(value), ctx)
    if kind == "jsonschema":
        from confluent_kafka.schema_registry.json_schema import JSONSerializer

        js = JSONSerializer(bench_schemas.SCHEMAS["jsonschema"][0], client)
        return lambda value: js(json.loads(value), ctx)
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    cls = bench_schemas.BenchOrder
    pb = ProtobufSerializer(cls, client, {"use.deprecated.format": False})
    return lambda value: pb(cls(**json.loads(value)), ctx)


def fill(bootstrap: str, topic: str, records: int, encode: Any = None) -> None:
    """``records`` JSON records into ``topic``; ``encode``: their value in another format."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 50, "queue.buffering.max.messages": 500_000}
    )
    for i in range(records):
        value = record_value(i) if encode is None else encode(record_value(i))
        while True:
            try:
                producer.produce(topic, value, key=b"%d" % i)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError(f"could not fill {topic}")


class Watcher:
    """Offsets of topics and groups, for deciding when a run is done."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": f"bench-watch-{uuid.uuid4().hex[:8]}"}
        )

    def end(self, topic: str) -> int:
        """Records in ``topic`` (the sum of its partitions' high watermarks)."""
        for attempt in range(50):
            try:
                return sum(
                    self.consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                    for p in range(PARTITIONS)
                )
            except KafkaException:
                # Just after a topic was created this client's metadata may not know the
                # leaders yet (NOT_LEADER_FOR_PARTITION); it refreshes within moments.
                if attempt == 49:
                    raise
                time.sleep(0.1)
        raise AssertionError("unreachable")

    def committed(self, group: str, topic: str) -> int:
        probe = Consumer({"bootstrap.servers": self.bootstrap, "group.id": group})
        try:
            tps = probe.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], 10)
            return sum(max(0, tp.offset) for tp in tps)
        finally:
            probe.close()

    def close(self) -> None:
        self.consumer.close()


def read_keys_and_times(bootstrap: str, topic: str) -> tuple[list[bytes | None], list[int]]:
    """Every record's key and log-append time (ms) in ``topic``, up to its current end."""
    # The test bed's reader: it knows where a transactional log (offtake-eos) ends.
    from offtake_testbed.kafka import read_topic

    keys: list[bytes | None] = []
    times: list[int] = []
    for m in read_topic(bootstrap, topic, timeout=120):
        kind, stamp = m.timestamp()
        if kind != TIMESTAMP_LOG_APPEND_TIME:
            raise RuntimeError(f"{topic}: expected log-append timestamps, got {kind}")
        keys.append(m.key())
        times.append(stamp)
    return keys, times


def create_output(broker: Any, topic: str) -> None:
    # The broker stamps each output record when it appends it: one clock for every contender,
    # whatever timestamp the contender copies from its input.
    broker.create_topic(topic, PARTITIONS, config={"message.timestamp.type": "LogAppendTime"})


# -- one throughput run -----------------------------------------------------------------------
def throughput_run(
    broker: Any,
    watcher: Watcher,
    contenders: Contenders,
    name: str,
    workload: Workload,
    source: str,
    records: int,
    tag: str,
    work: Path,
    registry: str | None = None,
) -> dict[str, Any]:
    output = f"out-{tag}"
    create_output(broker, output)
    group = f"bench-{tag}-{uuid.uuid4().hex[:6]}"
    job = Job(broker.bootstrap, source, output, group, workload, registry)
    argv, env = command(name, job, contenders, work)
    began = time.monotonic()
    process = Process(argv, env, work, tag, profile=name.startswith("offtake"))
    status = "ok"
    written, progress_at = 0, began
    limit = max(180.0, records / 1000)
    try:
        while written < records:
            code = process.exited()
            if code is not None:
                status = f"exited {code}"
                break
            now = time.monotonic()
            count = watcher.end(output)
            if count > written:
                written, progress_at = count, now
            elif now - progress_at > 60 or now - began > limit:
                status = "stalled"
                break
            time.sleep(0.1)
        wall = time.monotonic() - began
    finally:
        code, killed = process.stop()
    result: dict[str, Any] = {"status": status, "wall_seconds": round(wall, 2)}
    if status.startswith("exited"):
        text = process.log_path.read_text(errors="replace")
        if name.startswith("offtake") and code == 2 and "parallelism" in text:
            # The worker validates its manifest; an engine without processor.parallelism says so.
            result["status"] = "not supported"
            result["reason"] = process.tail(2)
            broker.delete_topic(output, missing_ok=True)
            return result
        result["log_tail"] = process.tail()
    if killed:
        result["status"] = status if status != "ok" else "ok, killed on stop"
    keys, times = read_keys_and_times(broker.bootstrap, output)
    check = verify_output(records, keys)
    committed = watcher.committed(job.group, source)
    rate = steady_rate(check.unique, times)
    cpu = cpu_between(process.cpu_samples, min(times), max(times)) if times else None
    result.update(
        records_per_second=None if rate is None else round(rate),
        # The contender's CPU (all its threads) per output record over the same window.
        cpu_us_per_record=round(cpu / check.unique * 1e6, 2) if cpu and check.unique else None,
        cpu_seconds_by_thread=by_name(process.threads),  # the whole run's, start-up included
        context_switches=sum(process.switches.values()),  # the whole run's, start-up included
        output=asdict(check),
        complete=check.complete,
        # A share group commits no offsets: its progress is its output (None: not applicable).
        committed_to_end=None if name in QUEUE_CONTENDERS else committed >= records,
        exit_code=code,
    )
    if result["status"] == "ok" and not check.complete:
        result["status"] = "incomplete"
    broker.delete_topic(output, missing_ok=True)
    return result


# -- one stalled-sink run ----------------------------------------------------------------------
STALL_RECORDS = 60_000  # several times the default in-flight bound (10,000 records)
IN_FLIGHT_BOUND = {"records": 10_000, "bytes": 64 * 2**20}  # the CRD's limits defaults


def stall_run(
    broker: Any, watcher: Watcher, contenders: Contenders, name: str, seconds: float, work: Path
) -> dict[str, Any]:
    """The worker's RSS while its sink accepts nothing, against the in-flight bound.

    The output topic does not exist (and the producer does not create topics): librdkafka
    holds every value while it waits for the topic to appear (topic.metadata.propagation.max.ms,
    30 s), so no delivery report arrives and nothing is committed: the sink is stalled while
    the input holds several bounds' worth of JSON records to enrich. (An output topic with
    min.insync.replicas 2 on this 1-broker cluster did not stall Kafka 4.3: it took them all.)
    """
    source, output = f"stall-in-{name}", f"stall-out-{name}"
    broker.create_topic(source, PARTITIONS)
    fill(broker.bootstrap, source, STALL_RECORDS, None)
    job = Job(broker.bootstrap, source, output, f"bench-stall-{name}", WORKLOADS[1])
    argv, env = command(name, job, contenders, work)
    process = Process(argv, env, work, f"stall-{name}")
    samples: list[tuple[float, int]] = []  # (seconds since it joined its group, RSS bytes)
    try:
        # The clock starts once the worker has joined its group: start-up (imports) takes
        # 20 s and more on a busy machine, and its RSS growth is not the stall's.
        _wait_for_member(broker.bootstrap, job.group, process, 180)
        began = time.monotonic()
        while time.monotonic() - began < seconds and process.exited() is None:
            rss = _rss(process.proc.pid)
            if rss is not None:
                samples.append((round(time.monotonic() - began, 1), rss))
            time.sleep(0.5)
        status = "ok" if process.exited() is None else f"exited {process.exited()}"
        committed = watcher.committed(job.group, source)
    finally:
        process.stop()
        broker.delete_topic(source, missing_ok=True)
    if not samples:
        return {"status": status, "log_tail": process.tail()}
    half = [rss for at, rss in samples if at >= seconds / 2]
    mib = 2**20
    return {
        # Nothing may be committed: a commit would mean a delivery report arrived.
        "status": status if committed == 0 else f"{status}, but {committed} records committed",
        "seconds": seconds,
        "input_records": STALL_RECORDS,
        "in_flight_bound": IN_FLIGHT_BOUND,
        "rss_mib_max": round(max(rss for _, rss in samples) / mib, 1),
        "rss_mib_end": round(samples[-1][1] / mib, 1),
        # Growth over the second half of the stall: about 0 when the bound holds.
        "rss_mib_growth_second_half": round((half[-1] - half[0]) / mib, 1) if half else None,
        "rss_mib_samples": [(at, round(rss / mib, 1)) for at, rss in samples],
    }


def _wait_for_member(bootstrap: str, group: str, process: Process, timeout: float) -> None:
    """Until ``group`` has a member (or the process exited, or ``timeout`` passed)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.exited() is None:
        try:
            described = admin.describe_consumer_groups([group])[group].result(10)
            if described.members:
                return
        except Exception:  # not known yet
            pass
        time.sleep(0.5)


def _rss(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# -- one latency run --------------------------------------------------------------------------
def latency_run(
    broker: Any,
    watcher: Watcher,
    contenders: Contenders,
    name: str,
    seconds: float,
    work: Path,
) -> dict[str, Any]:
    source, output = f"lat-in-{name}", f"lat-out-{name}"
    # Both topics stamp their records on append: the input's stamp splits each record's
    # latency into the bench producer's part (to the input log) and the contender's (from the
    # input log to the output log: fetch, work, produce).
    create_output(broker, source)
    create_output(broker, output)
    job = Job(
        broker.bootstrap, source, output, f"bench-lat-{name}-{uuid.uuid4().hex[:6]}", WORKLOADS[0]
    )
    argv, env = command(name, job, contenders, work)
    process = Process(argv, env, work, f"latency-{name}")
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 1})
    total = int(LATENCY_RATE * seconds)
    sent_ms = [0.0] * total
    result: dict[str, Any] = {"offered_per_second": LATENCY_RATE, "offered_records": total}
    try:
        # Warm-up: the contender has joined its group and forwarded records before the clock.
        for i in range(WARMUP_RECORDS):
            producer.produce(source, record_value(i), key=b"w%d" % i)
        producer.flush(30)
        if not _wait_for(watcher, output, WARMUP_RECORDS, process, 120):
            result["status"] = "no output during warm-up"
            result["log_tail"] = process.tail()
            return result
        began = time.monotonic()
        began_ms = time.time() * 1000
        switches = sum(process.switches.values())
        i = 0
        while i < total:
            due = min(total, int((time.monotonic() - began) * LATENCY_RATE) + 1)
            while i < due:
                sent_ms[i] = time.time() * 1000
                producer.produce(source, record_value(i), key=b"%d" % i)
                i += 1
            producer.poll(0)
            time.sleep(0.001)
        producer.flush(30)
        offered_seconds = time.monotonic() - began
        offered_ms = time.time() * 1000
        switches = sum(process.switches.values()) - switches
        done = _wait_for(watcher, output, WARMUP_RECORDS + total, process, 60)
    finally:
        process.stop()
    cpu = cpu_between(process.cpu_samples, began_ms, offered_ms)
    first = _first_stamps(broker.bootstrap, output)
    appended = _first_stamps(broker.bootstrap, source)
    latencies = sorted(stamp - sent_ms[i] for i, stamp in first.items())
    through = sorted(stamp - appended[i] for i, stamp in first.items() if i in appended)
    result.update(
        status="ok" if done and len(first) == total else "incomplete",
        offered_seconds=round(offered_seconds, 2),
        delivered=len(first),
        context_switches_per_second=round(switches / offered_seconds),
        # The contender's CPU (all threads) while records were offered, in % of one core.
        cpu_percent=None if cpu is None else round(100 * cpu / offered_seconds, 1),
    )
    if latencies:
        result.update(
            p50_ms=round(percentile(latencies, 50), 1),
            p99_ms=round(percentile(latencies, 99), 1),
            max_ms=round(latencies[-1], 1),
            # The contender's own part: input log-append time to output log-append time.
            through_p50_ms=round(percentile(through, 50), 1) if through else None,
            through_p99_ms=round(percentile(through, 99), 1) if through else None,
            # Means: the log's whole milliseconds truncate alike on average, percentiles do not.
            through_mean_ms=round(sum(through) / len(through), 2) if through else None,
            to_input_mean_ms=round(
                sum(appended[i] - sent_ms[i] for i in first if i in appended) / len(through), 2
            )
            if through
            else None,
            output_per_second=round(steady_rate(len(first), list(first.values())) or 0),
        )
        if offered_seconds > 1.1 * seconds:
            # The bench's own producer could not keep the rate while this contender ran (the
            # broker or the CPUs were saturated): the latency includes that queue.
            result["status"] += f", offered only {total / offered_seconds:,.0f}/s"
        elif result["output_per_second"] < 0.9 * LATENCY_RATE:
            # It fell behind the offered rate: its latency is queueing, growing with the run.
            result["status"] += ", saturated"
    broker.delete_topic(source, missing_ok=True)
    broker.delete_topic(output, missing_ok=True)
    return result


def _first_stamps(bootstrap: str, topic: str) -> dict[int, int]:
    """Each measured record's (not a warm-up's) first log-append time in ``topic``, by key."""
    keys, times = read_keys_and_times(bootstrap, topic)
    first: dict[int, int] = {}
    for key, stamp in zip(keys, times, strict=True):
        if key is not None and not key.startswith(b"w"):
            i = int(key)
            first[i] = min(stamp, first.get(i, stamp))
    return first


def _wait_for(watcher: Watcher, topic: str, count: int, process: Process, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if watcher.end(topic) >= count:
            return True
        if process.exited() is not None:
            return False
        time.sleep(0.1)
    return False


# -- the run ----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--records",
        type=int,
        help="pass-through records (default 200,000; --quick 50,000); json gets half as many, "
        "each cpu workload a tenth",
    )
    parser.add_argument("--rounds", type=int, help="rounds, best kept (default 2; --quick 1)")
    parser.add_argument(
        "--only", help=f"comma-separated contenders to run (of {','.join(CONTENDERS)})"
    )
    parser.add_argument(
        "--workloads", help=f"comma-separated workloads (of {','.join(w.name for w in WORKLOADS)})"
    )
    parser.add_argument(
        "--latency-seconds",
        type=float,
        help=f"seconds at {LATENCY_RATE:,} records/s per contender (default 8; --quick 3; 0: skip)",
    )
    parser.add_argument("--quick", action="store_true", help="a ~2 minute run, smaller counts")
    parser.add_argument("--json", type=Path, help="where to write the figures")
    parser.add_argument(
        "--profile",
        type=Path,
        help="py-spy (pip install py-spy) records each Offtake throughput run with --gil "
        "into DIR/<workload>-<contender>-<round>.txt (collapsed stacks)",
    )
    parser.add_argument(
        "--stall-seconds",
        type=float,
        help="seconds of the worker's RSS with a stalled sink (default 40; --quick 25; 0: skip)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout (e.g. the main branch's) whose worker runs as contender "
        "offtake-base beside this one's: before and after in the same run",
    )
    parser.add_argument(
        "--cpus",
        help="hold every contender's process to these CPUs (taskset -c, e.g. 1): the rate "
        "where the CPU is the limit; the broker stays free",
    )
    args = parser.parse_args(argv)
    if args.cpus is not None:
        global PINNED
        PINNED = args.cpus
    if args.baseline is not None:
        global BASELINE
        BASELINE = args.baseline.resolve()
    if args.profile is not None:
        global PROFILE_DIR
        args.profile.mkdir(parents=True, exist_ok=True)
        PROFILE_DIR = args.profile
    records = args.records or (50_000 if args.quick else 200_000)
    rounds = args.rounds or (1 if args.quick else 2)
    latency_seconds = (
        args.latency_seconds if args.latency_seconds is not None else (3 if args.quick else 8)
    )
    stall_seconds = (
        # Long enough for the worker to start and reach the bound on a busy machine (10 s was not).
        args.stall_seconds if args.stall_seconds is not None else (25 if args.quick else 40)
    )
    default = [c for c in CONTENDERS if c not in BASELINES or BASELINE is not None]
    names = [c for c in CONTENDERS if c in args.only.split(",")] if args.only else default
    unknown = set((args.only or "").split(",")) - set(CONTENDERS) - {""}
    if unknown:
        parser.error(f"--only: unknown contender(s) {sorted(unknown)}")
    workloads = [w for w in WORKLOADS if not args.workloads or w.name in args.workloads.split(",")]
    started = time.monotonic()
    stamp = datetime.datetime.now(datetime.UTC)
    out_path = args.json or BENCH / "results" / f"passthrough-{stamp:%Y-%m-%d}.json"

    contenders = prepare(names)
    names = [n for n in names if n not in contenders.unavailable]
    from offtake_testbed.kafka import KAFKA_VERSION, KafkaBroker

    work = Path(tempfile.mkdtemp(prefix="offtake-bench-passthrough-"))
    load_at_start = os.getloadavg()[0]
    throughput: dict[str, dict[str, Any]] = {w.name: {} for w in workloads}
    latency: dict[str, Any] = {}
    costs: dict[str, Any] = {}
    stalls: dict[str, Any] = {}
    counts = {w.name: max(2, int(records * w.share)) for w in workloads}
    try:
        with KafkaBroker() as broker, contextlib.ExitStack() as stack:
            registry = None
            if any(w.kind in SCHEMA_KINDS for w in workloads):
                from offtake_testbed.apicurio import ApicurioRegistry

                registry = stack.enter_context(ApicurioRegistry()).url
            watcher = Watcher(broker.bootstrap)
            try:
                measure(
                    broker,
                    watcher,
                    contenders,
                    names,
                    workloads,
                    counts,
                    rounds,
                    latency_seconds,
                    work,
                    throughput,
                    latency,
                    costs,
                    registry,
                    stall_seconds,
                    stalls,
                )
            finally:
                watcher.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    summary = summarize(throughput)
    report = {
        "date": stamp.isoformat(timespec="seconds"),
        "kafka_version": KAFKA_VERSION,
        "cpus": os.cpu_count(),
        "contenders_pinned_to": PINNED,
        "load_average_1m": {"start": round(load_at_start, 2), "end": round(os.getloadavg()[0], 2)},
        "seconds": round(time.monotonic() - started),
        "records": counts,
        "value_bytes": VALUE_BYTES,
        "partitions": PARTITIONS,
        "rounds": rounds,
        "versions": contenders.versions,
        "unavailable": contenders.unavailable,
        "throughput_measure": (
            "distinct output records / (last - first output record log-append time); "
            "best of rounds, order alternating"
        ),
        "latency_measure": (
            f"output log-append time - bench produce time, {LATENCY_RATE}/s offered "
            "after a warm-up, pass-through workload; best p99 of the rounds, order alternating"
        ),
        "summary": summary,
        "costs_measure": (
            "CPU us per record of Offtake's decode, function and encode in the bench's process "
            "(the worker's decoder and encoder, a 500-record batch at a time); engine: 1e6 / "
            "Offtake's rate - their sum"
        ),
        "cpu_measure": (
            "CPU seconds (user + system, all threads, from /proc every 50 ms) the contender used "
            "between its first and last output record, per distinct output record"
        ),
        "costs": with_engine(costs, summary),
        "throughput": throughput,
        "latency": latency,
        "stalled_sink_measure": (
            "the worker's RSS every 0.5 s while its output topic does not exist (every value "
            f"waits in the producer), {STALL_RECORDS} JSON records to enrich"
        ),
        "stalled_sink": stalls,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    print(f"\nfigures: {out_path}  ({report['seconds']}s)")
    return 0


def measure(
    broker: Any,
    watcher: Watcher,
    contenders: Contenders,
    names: Sequence[str],
    workloads: Sequence[Workload],
    counts: dict[str, int],
    rounds: int,
    latency_seconds: float,
    work: Path,
    throughput: dict[str, dict[str, Any]],
    latency: dict[str, Any],
    costs: dict[str, Any],
    registry: str | None = None,
    stall_seconds: float = 0,
    stalls: dict[str, Any] | None = None,
) -> None:
    """Fill the inputs, run every round, then the latency and stalled-sink runs; results go
    into the dicts."""
    stalls = {} if stalls is None else stalls
    sources: dict[str, str] = {}
    for w in workloads:
        sources[w.name] = f"in-{w.name}"
        broker.create_topic(sources[w.name], PARTITIONS)
        began = time.monotonic()
        assert registry is not None or w.kind not in SCHEMA_KINDS
        encode = wire_encoder(w.kind, registry, sources[w.name]) if w.kind in SCHEMA_KINDS else None
        fill(broker.bootstrap, sources[w.name], counts[w.name], encode)
        log(
            f"filled {sources[w.name]}: {counts[w.name]:,} records "
            f"in {time.monotonic() - began:.1f}s"
        )
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for w in workloads:
            for name in order:
                runs = throughput[w.name].setdefault(name, {"rounds": []})
                reason = supports(name, w)
                if reason is not None:
                    runs.update(status="n/a", reason=reason)
                    continue
                if runs.get("status") == "not supported":
                    continue  # the same engine will not accept it in the next round
                tag = f"{w.name}-{name}-{r}"
                got = throughput_run(
                    broker,
                    watcher,
                    contenders,
                    name,
                    w,
                    sources[w.name],
                    counts[w.name],
                    tag,
                    work,
                    registry,
                )
                runs["rounds"].append(got)
                if got["status"] == "not supported":
                    runs.update(status="not supported", reason=got.get("reason"))
                log(f"round {r + 1} {w.name:<7} {name:<11} {_describe(got)}")
    for w in workloads:
        if w.kind in ("json", *SCHEMA_KINDS) and "offtake" in names:
            costs[w.name] = per_record_costs(
                broker.bootstrap, registry, sources[w.name], w.kind, work
            )
            log(f"costs {w.name:<7} {costs[w.name]}")
    if latency_seconds > 0:
        # Rounds in alternating order, the best p99 kept, as for throughput: whichever
        # contender runs first after the throughput runs measured several times slower than
        # in any other position (p50 0.1-1.8 s against 5-9 ms), whichever it was.
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                got = latency_run(broker, watcher, contenders, name, latency_seconds, work)
                log(f"latency round {r + 1} {name:<11} {_describe_latency(got)}")
                kept = latency.get(name)
                rounds_so_far = [*(kept or {}).get("rounds", []), got]
                if kept is None or got.get("p99_ms", float("inf")) < kept.get(
                    "p99_ms", float("inf")
                ):
                    kept = dict(got)
                kept["rounds"] = rounds_so_far
                latency[name] = kept
        for name in names:
            log(f"latency {name:<11} {_describe_latency(latency[name])} (best of {rounds})")
    if stall_seconds > 0:
        for name in names:
            if name in ("offtake", "offtake-base"):
                stalls[name] = stall_run(broker, watcher, contenders, name, stall_seconds, work)
                log(f"stalled sink {name:<11} {_describe_stall(stalls[name])}")


def per_record_costs(
    bootstrap: str, registry: str | None, topic: str, kind: str, work: Path
) -> dict[str, float]:
    """Microseconds per record of Offtake's decode, the workload's function and encode: the
    worker's own decoder and encoder (built from a spec as it builds them) over the input
    topic's records, in this process, after a first batch that fetched the writer schema."""
    import bench_schemas
    import bench_workloads

    from offtake.config.spec import KafkaSinkSpec, SchemaRegistrySpec, SinkSchemaSpec, SourceSpec
    from offtake.formats.resolve import decoder_for, encoder_for
    from offtake_testbed.kafka import read_topic

    schema_registry = SchemaRegistrySpec(registry) if registry and kind in SCHEMA_KINDS else None
    source = SourceSpec(
        topics=(topic,),
        group_id="costs",
        group_type="consumer",
        start_from="earliest",
        format=kind,  # type: ignore[arg-type]
        schema_registry=schema_registry,
        protobuf_message=bench_schemas.PROTOBUF_IN if kind == "protobuf" else None,
    )
    schema = None
    if kind in ("avro", "jsonschema"):
        schema_file = work / f"costs-{kind}.schema.json"
        schema_file.write_text(bench_schemas.SCHEMAS[kind][1])
        schema = SinkSchemaSpec(file=str(schema_file))
    sink = KafkaSinkSpec(
        topic=f"costs-{kind}",
        delivery="at-least-once",
        format=kind if kind in SCHEMA_KINDS else "json",  # type: ignore[arg-type]
        schema=schema,
        protobuf_message=bench_schemas.PROTOBUF_OUT if kind == "protobuf" else None,
        auto_register=True,
        schema_registry=schema_registry,
    )
    messages = read_topic(bootstrap, topic)
    decoder, encoder = decoder_for(source), encoder_for(sink)
    decoder.records(messages[:1], topic, 0)  # the writer schema's one registry lookup
    # As the worker runs them: a poll's batch at a time, its values dropped before the next
    # (kept all at once, the allocator's growth was most of "encode": 2.5 of 2.9 us a record);
    # CPU time of this thread, so that the machine's other jobs do not count.
    batches = [messages[i : i + 500] for i in range(0, len(messages), 500)]
    best = {"decode": math.inf, "function": math.inf, "encode": math.inf}
    clock = time.thread_time
    for _ in range(COST_ROUNDS):  # best of: the other jobs on a shared machine only add
        spent = dict.fromkeys(best, 0.0)
        for batch in batches:
            began = clock()
            records = [record for record, _ in decoder.records(batch, topic, 0)]
            decoded = clock()
            values = [bench_workloads.offtake_enrich(record) for record in records]
            processed = clock()
            encoder.encode_many(values)
            spent["encode"] += clock() - processed
            spent["function"] += processed - decoded
            spent["decode"] += decoded - began
        best = {part: min(best[part], spent[part]) for part in best}
    n = len(messages) or 1
    return {f"{part}_us": round(seconds / n * 1e6, 2) for part, seconds in best.items()}


def with_engine(costs: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """The costs, each with what the rest of the worker took per record (poll, dispatch,
    produce, commit: the engine), from Offtake's measured rate."""
    out: dict[str, Any] = {}
    for workload, parts in costs.items():
        rate = summary.get(workload, {}).get("offtake", {}).get("records_per_second")
        total = 1e6 / rate if rate else None
        own = sum(parts.values())
        # None when the rate (a short run's, on a busy machine) says less than the parts.
        engine = round(total - own, 2) if total and total > own else None
        out[workload] = {**parts, "engine_us": engine, "total_us": total and round(total, 2)}
    return out


def summarize(throughput: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per workload and contender: best steady rate and its ratios against each anchor."""
    out: dict[str, dict[str, Any]] = {}
    for workload, by_name in throughput.items():
        best: dict[str, int | None] = {}
        for name, runs in by_name.items():
            rates = [
                g["records_per_second"]
                for g in runs["rounds"]
                if g.get("complete") and g.get("records_per_second")
            ]
            best[name] = max(rates) if rates else None
        cpu: dict[str, float | None] = {}
        for name, runs in by_name.items():
            costs = [
                g["cpu_us_per_record"]
                for g in runs["rounds"]
                if g.get("complete") and g.get("cpu_us_per_record")
            ]
            cpu[name] = min(costs) if costs else None
        row: dict[str, Any] = {}
        for name, rate in best.items():
            entry: dict[str, Any] = {"records_per_second": rate}
            runs = by_name[name]
            # CPU per record, and the loop's against it (above 1: cheaper than the loop).
            entry["cpu_us_per_record"] = cpu[name]
            mine, loop_cpu = cpu[name], cpu.get("loop")
            entry["cpu_x_loop"] = round(loop_cpu / mine, 2) if loop_cpu and mine else None
            if rate is None:
                entry["status"] = runs.get("status") or _statuses(runs["rounds"])
                if runs.get("reason"):
                    entry["reason"] = runs["reason"]
            for anchor in ANCHORS:
                base = best.get(anchor)
                entry[f"x_{anchor}"] = round(rate / base, 2) if rate and base else None
            entry["duplicates"] = max(
                (g["output"]["duplicates"] for g in runs["rounds"] if "output" in g), default=None
            )
            row[name] = entry
        out[workload] = row
    return out


def _statuses(rounds: list[dict[str, Any]]) -> str:
    return ", ".join(sorted({g["status"] for g in rounds})) or "not run"


def render(report: dict[str, Any]) -> str:
    lines = [
        f"Kafka {report['kafka_version']}, {report['partitions']} partitions, "
        f"{report['value_bytes']}-byte values, best of {report['rounds']} round(s); "
        f"load average {report['load_average_1m']['start']} -> "
        f"{report['load_average_1m']['end']} on {report['cpus']} CPUs (shared: read ratios)",
        "",
        f"{'workload':<8} {'contender':<11} {'records/s':>10} {'x loop':>7} {'x quix':>7} "
        f"{'x arroyo':>8} {'x offtake':>9} {'x loop-queue':>12} {'cpu us':>7} "
        f"{'cpu x loop':>10} {'dups':>6}  note",
    ]
    for workload, row in report["summary"].items():
        n = report["records"][workload]
        for name, e in row.items():
            rate = e["records_per_second"]
            cells = [
                f"{workload:<8} {name:<11}",
                f"{rate:>10,}" if rate else f"{'-':>10}",
                *(
                    f"{e[f'x_{a}']:>{w}.2f}" if e[f"x_{a}"] else f"{'-':>{w}}"
                    for a, w in (
                        ("loop", 7),
                        ("quix", 7),
                        ("arroyo", 8),
                        ("offtake", 9),
                        ("loop-queue", 12),
                    )
                ),
                f"{e['cpu_us_per_record']:>7.1f}" if e.get("cpu_us_per_record") else f"{'-':>7}",
                f"{e['cpu_x_loop']:>10.2f}" if e.get("cpu_x_loop") else f"{'-':>10}",
                f"{e['duplicates']:>6}" if e["duplicates"] is not None else f"{'-':>6}",
            ]
            note = "" if rate else e.get("status", "")
            if e.get("reason") and not rate:
                note += f": {e['reason'].splitlines()[-1][:80]}"
            lines.append(" ".join(cells) + f"  {note}".rstrip())
        lines.append(f"{'':<8} ({n:,} records)")
    if report["costs"]:
        lines += [
            "",
            "where Offtake's time goes per record, us (decode, function, encode measured "
            "in-process; engine: the rest of 1/rate):",
            f"{'workload':<10}"
            + "".join(f" {h:>8}" for h in ("decode", "function", "encode", "engine", "total")),
        ]
        for workload, c in report["costs"].items():
            parts = ("decode", "function", "encode", "engine", "total")
            cells = [c[f"{p}_us"] for p in parts]
            lines.append(
                f"{workload:<10}"
                + "".join(f" {v:>8.1f}" if v is not None else f" {'-':>8}" for v in cells)
            )
    if report["latency"]:
        lines += [
            "",
            f"latency at {LATENCY_RATE:,} records/s offered (pass-through), ms:",
            "(through: from the input's log-append time, the contender's own part)",
            f"{'contender':<11} {'p50':>8} {'p99':>8} {'max':>8} {'thr p50':>8} {'thr p99':>8} "
            f"{'out/s':>8}  status",
        ]
        for name, e in report["latency"].items():
            lines.append(
                f"{name:<11} {e.get('p50_ms', '-'):>8} {e.get('p99_ms', '-'):>8} "
                f"{e.get('max_ms', '-'):>8} {e.get('through_p50_ms') or '-':>8} "
                f"{e.get('through_p99_ms') or '-':>8} "
                f"{e.get('output_per_second', '-'):>8}  {e['status']}"
            )
    if report["stalled_sink"]:
        bound = IN_FLIGHT_BOUND
        lines += [
            "",
            f"worker RSS with a stalled sink ({STALL_RECORDS:,} records waiting; in-flight "
            f"bound {bound['records']:,} records, {bound['bytes'] // 2**20} MiB), MiB:",
            f"{'contender':<13} {'max':>7} {'end':>7} {'2nd half':>9}  status",
        ]
        for name, e in report["stalled_sink"].items():
            growth = e.get("rss_mib_growth_second_half")
            lines.append(
                f"{name:<13} {e.get('rss_mib_max', '-'):>7} {e.get('rss_mib_end', '-'):>7} "
                f"{'-' if growth is None else f'{growth:+}':>9}  {e['status']}"
            )
    if report["unavailable"]:
        lines.append("")
        lines += [f"skipped {name}: {why}" for name, why in report["unavailable"].items()]
    lines.append("")
    lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()))
    return "\n".join(lines)


def _yes_no(value: bool | None) -> str:
    return "n/a" if value is None else ("yes" if value else "NO")


def _describe(got: dict[str, Any]) -> str:
    if got.get("records_per_second") is None:
        return f"{got['status']} {got.get('reason') or got.get('log_tail', '')[-300:]}"
    out = got["output"]
    return (
        f"{got['records_per_second']:>9,} records/s  "
        f"cpu {got.get('cpu_us_per_record') or '-'} us/record  wall {got['wall_seconds']:.1f}s  "
        f"dups {out['duplicates']}  missing {out['missing']}  "
        f"committed {_yes_no(got['committed_to_end'])}  {got['status']}"
    )


def _describe_stall(got: dict[str, Any]) -> str:
    if "rss_mib_max" not in got:
        return f"{got['status']} {got.get('log_tail', '')[-300:]}"
    return (
        f"RSS max {got['rss_mib_max']} MiB, end {got['rss_mib_end']} MiB, "
        f"second half {got['rss_mib_growth_second_half']:+} MiB over {got['seconds']:.0f}s  "
        f"{got['status']}"
    )


def _describe_latency(got: dict[str, Any]) -> str:
    if "p99_ms" not in got:
        return f"{got['status']} {got.get('log_tail', '')[-300:]}"
    return (
        f"p50 {got['p50_ms']} ms  p99 {got['p99_ms']} ms  max {got['max_ms']} ms  "
        f"(input log to output log: p50 {got.get('through_p50_ms')} p99 "
        f"{got.get('through_p99_ms')} ms, mean {got.get('through_mean_ms')}; to it: mean "
        f"{got.get('to_input_mean_ms')})  {got['context_switches_per_second']:,} switches/s  "
        f"cpu {got.get('cpu_percent')}%  "
        f"delivered {got['delivered']:,}/{got['offered_records']:,}  {got['status']}"
    )


if __name__ == "__main__":
    sys.exit(main())
