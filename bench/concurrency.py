"""Waiting on other services: many calls in flight per worker, order kept per key (issue 37).

    python bench/concurrency.py [--quick] [--n 64,256,1024] [--partitions 1,12]
        [--keys 10,1000,100000] [--latency-ms 20,100] [--seconds S] [--only F,F] [--json PATH]

Each record costs one call to a local HTTP service (offtake_testbed.latency_service, its own
process, 127.0.0.1) that answers after a set latency and counts the calls of one key that
overlap. One real Kafka broker (offtake_testbed.kafka), one input topic per workload (the
partitions, the distinct keys), every contender in the same run against the same broker and
the same service, each in its own process, consuming the input in its own group and producing
each record to an output topic, at least once:

- ``ceiling``: the bare asyncio client alone (aiohttp, no Kafka) at N calls in flight, measured
  first; the ceiling of a contender at N is min(N / latency, what this client got), and in key
  order min(N, keys) / latency (one call per key in flight);
- ``offtake-c1``: ``offtake worker`` with a plain ``def`` function (http.client), concurrency 1:
  today's one call at a time;
- ``offtake-key`` / ``offtake-none``: ``async def`` (aiohttp, its session opened by
  ``processor.lifespan``), ``processor.concurrency`` N, ``processor.order`` key / none;
- ``offtake-threads``: the ``def`` function on N threads, order none (not in the default set);
- ``arroyo``: Sentry's Arroyo, RunTaskInThreads with N threads (http.client) -> Produce ->
  CommitOffsets (its own order: none per key, results forwarded in offset order);
- ``pc-key`` / ``pc-none``: the anchor, Confluent's Parallel Consumer 0.5.3.3 (Java,
  bench/parallel_consumer/), ordering KEY / UNORDERED, maxConcurrency N, java.net.http on its
  worker threads, pollAndProduce.

What is measured, per workload and contender:

- records/s in steady state: the calls the service answered (one a record; sampled every
  0.2 s) from the first call + ``--warmup`` seconds to the stop, over that window, so start-up,
  group join and JIT warm-up are not charged. A run stops after ``--seconds`` of calls or when
  the input is done. The output's rate over the same window is kept beside it (a contender
  that writes its output in bursts, one poll's batch at a time, reads lower there);
- its ratio to the ceiling at its N and to the Parallel Consumer at the same N and order in the
  same run (order none for Arroyo and the threads);
- overlapping calls of one key (the service's count; 0 is the rule in key order) and records of
  one key that reached the output out of offset order (first occurrences only);
- CPU per record (user + system, all threads, from /proc, over the measured window) and the
  process's largest RSS: RSS at 100,000 keys against 10 keys tells whether per-key state stays
  flat.

This machine is shared (2 cores, other jobs): absolute rates move from run to run. Read the
ratios against the ceiling and the Parallel Consumer measured in the same run. The load
average is recorded. Figures go to bench/results/concurrency-<date>.json (or ``--json``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
VALUE_BYTES = 64
FAMILIES = (
    "offtake-c1",
    "offtake-key",
    "offtake-none",
    "offtake-key-base",
    "offtake-none-base",
    "offtake-threads",
    "arroyo",
    "pc-key",
    "pc-none",
)
# --baseline DIR: another checkout (e.g. /work/main) whose worker runs as offtake-key-base and
# offtake-none-base beside this one's: before and after in one run, on one broker and service.
BASELINES = ("offtake-key-base", "offtake-none-base")
BASELINE: Path | None = None
DEFAULT_FAMILIES = tuple(f for f in FAMILIES if f != "offtake-threads" and f not in BASELINES)
# Which Parallel Consumer a contender is read against: the same N, the same order.
PC_ANCHOR = {
    "offtake-key": "pc-key",
    "offtake-none": "pc-none",
    "offtake-key-base": "pc-key",
    "offtake-none-base": "pc-none",
    "offtake-threads": "pc-none",
    "arroyo": "pc-none",
}
KEY_ORDERED = ("offtake-key", "offtake-key-base", "pc-key")
# --cpus LIST: every contender's process held to these CPUs (taskset -c), as in
# bench/passthrough.py: the rate where the CPU is the limit, the broker and the service free.
PINNED: str | None = None
# --profile DIR: py-spy records each Offtake run (--gil, collapsed stacks) into DIR.
PROFILE_DIR: Path | None = None
# The bare client's CPU per call, by latency and N, each round's (bench/concurrency_contenders).
CEILING_CPU: dict[str, dict[int, list[float | None]]] = {}
ARROYO_REQUIREMENT = "sentry-arroyo==2.48.0"  # as bench/passthrough.py pins it


@dataclass(frozen=True)
class Workload:
    partitions: int
    keys: int
    latency_ms: float

    @property
    def name(self) -> str:
        return f"p{self.partitions}-k{self.keys}-{self.latency_ms:g}ms"


@dataclass(frozen=True)
class Contender:
    family: str
    n: int  # calls in flight at most (1 for offtake-c1)

    @property
    def name(self) -> str:
        return self.family if self.family == "offtake-c1" else f"{self.family}-{self.n}"

    @property
    def order(self) -> str:
        if self.family in KEY_ORDERED:
            return "key"
        return "partition" if self.family == "offtake-c1" else "none"


@dataclass(frozen=True)
class Settings:
    ns: tuple[int, ...]
    partitions: tuple[int, ...]
    keys: tuple[int, ...]
    latencies_ms: tuple[float, ...]
    families: tuple[str, ...]
    seconds: float  # of output per run, at most
    warmup: float  # seconds of output not measured
    records: int  # input records per workload (at least its keys)
    ceiling_seconds: float
    json: Path | None
    quick: bool

    def workloads(self) -> list[Workload]:
        return [
            Workload(p, k, lat)
            for lat in self.latencies_ms
            for p in self.partitions
            for k in self.keys
        ]

    def contenders(self) -> list[Contender]:
        out: list[Contender] = []
        for family in self.families:
            if family == "offtake-c1":
                out.append(Contender(family, 1))
            else:
                out += [Contender(family, n) for n in self.ns]
        return out


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part.replace("_", "")) for part in text.split(",") if part)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(part) for part in text.split(",") if part)


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="one small workload, seconds a run")
    parser.add_argument("--n", help="calls in flight (default 64,256,1024; --quick 64)")
    parser.add_argument("--partitions", help="input partitions (default 1,12; --quick 1)")
    parser.add_argument("--keys", help="distinct keys (default 10,1000,100000; --quick 1000)")
    parser.add_argument("--latency-ms", help="service latency (default 20,100; --quick 20)")
    parser.add_argument(
        "--only",
        help=f"comma-separated families (of {','.join(FAMILIES)}; default all but offtake-threads)",
    )
    parser.add_argument("--seconds", type=float, help="output seconds per run (15; --quick 4)")
    parser.add_argument(
        "--warmup",
        type=float,
        # 3 s charged the Parallel Consumer's JIT to it on a busy machine: 0.2-0.4x of what it
        # did after 20 s (2026-11-28, docs/bench.md).
        help="seconds of calls not measured (15; --quick 2)",
    )
    parser.add_argument(
        "--records", type=int, help="input records per workload (200,000; --quick 20,000)"
    )
    parser.add_argument("--json", type=Path, help="where to write the figures")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout (e.g. the main branch's) whose worker runs as offtake-key-base "
        "and offtake-none-base beside this one's: before and after in the same run",
    )
    parser.add_argument(
        "--cpus",
        help="hold every contender's process to these CPUs (taskset -c, e.g. 1): the rate "
        "where the CPU is the limit; the broker and the service stay free",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="py-spy (pip install py-spy) records each Offtake run with --gil into "
        "DIR/<workload>-<contender>.txt (collapsed stacks)",
    )
    args = parser.parse_args(argv)
    global BASELINE, PINNED, PROFILE_DIR
    BASELINE = args.baseline.resolve() if args.baseline is not None else None
    PINNED = args.cpus
    PROFILE_DIR = args.profile
    if PROFILE_DIR is not None:
        PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    if BASELINE is not None and not (BASELINE / "worker" / "offtake").is_dir():
        parser.error(f"--baseline: {BASELINE} has no worker/offtake (not an Offtake checkout)")
    if args.only:
        families = tuple(args.only.split(","))
    else:
        families = DEFAULT_FAMILIES + (BASELINES if BASELINE is not None else ())
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        parser.error(f"--only: unknown families {unknown} (known: {', '.join(FAMILIES)})")
    if BASELINE is None and set(families) & set(BASELINES):
        parser.error(f"--only: {', '.join(BASELINES)} need --baseline DIR (another checkout)")
    quick = bool(args.quick)
    try:
        ns = _ints(args.n) if args.n else ((64,) if quick else (64, 256, 1024))
        partitions = _ints(args.partitions) if args.partitions else ((1,) if quick else (1, 12))
        keys = _ints(args.keys) if args.keys else ((1000,) if quick else (10, 1000, 100_000))
        latencies = (
            _floats(args.latency_ms) if args.latency_ms else ((20.0,) if quick else (20.0, 100.0))
        )
    except ValueError as exc:
        parser.error(f"a comma-separated list of numbers was expected: {exc}")
    for what, values in (("--n", ns), ("--partitions", partitions), ("--keys", keys)):
        if not values or min(values) < 1:
            parser.error(f"{what}: numbers of at least 1 expected, got {values}")
    if not latencies or min(latencies) <= 0:
        parser.error(f"--latency-ms: positive numbers expected, got {latencies}")
    seconds = args.seconds if args.seconds is not None else (4.0 if quick else 15.0)
    return Settings(
        ns=ns,
        partitions=partitions,
        keys=keys,
        latencies_ms=latencies,
        families=tuple(f for f in FAMILIES if f in families),
        seconds=seconds,
        warmup=args.warmup if args.warmup is not None else (2.0 if quick else 15.0),
        records=args.records or (20_000 if quick else 200_000),
        ceiling_seconds=seconds,
        json=args.json,
        quick=quick,
    )


# -- the figures ------------------------------------------------------------------------------
def ceiling(n: int, latency_ms: float, bare: float | None, keys: int | None = None) -> float:
    """A contender's ceiling at N: N calls per latency, or less if the bare client got less.
    In key order (``keys`` given) at most one call per key is in flight, so min(N, keys)."""
    bound = (n if keys is None else min(n, keys)) * 1000 / latency_ms
    return bound if bare is None else min(bound, bare)


def best_of(
    *rounds: dict[str, dict[int, float | None]],
) -> dict[str, dict[int, float | None]]:
    """Per latency and N, the highest of the rounds' rates (None where none measured)."""
    out: dict[str, dict[int, float | None]] = {}
    for got in rounds:
        for latency, by_n in got.items():
            for n, rate in by_n.items():
                kept = out.setdefault(latency, {}).get(n)
                out[latency][n] = rate if kept is None or (rate or 0) > kept else kept
    return out


def ratio(value: float | None, base: float | None) -> float | None:
    return round(value / base, 2) if value and base else None


def calls_rate(
    samples: Sequence[tuple[float, int]], warmup_s: float
) -> tuple[float, float, float, int]:
    """(calls/s, window start ms, window end ms, calls in it) from (wall ms, calls answered)
    samples: from the first sample after the first call + ``warmup_s`` to the last sample;
    (0, 0, 0, 0) when that window holds no call."""
    first = next((at for at, count in samples if count > 0), None)
    if first is None:
        return 0.0, 0.0, 0.0, 0
    start = next(((at, n) for at, n in samples if at >= first + warmup_s * 1000), None)
    if start is None:
        return 0.0, 0.0, 0.0, 0
    end = samples[-1]
    calls, span = end[1] - start[1], (end[0] - start[0]) / 1000
    if calls <= 0 or span <= 0:
        return 0.0, 0.0, 0.0, 0
    return calls / span, start[0], end[0], calls


def out_of_order(pairs: Iterable[tuple[bytes | None, int]]) -> int:
    """Records, in output order, whose index is below an earlier one of the same key (a record's
    repeats, redeliveries, are not counted)."""
    highest: dict[bytes | None, int] = {}
    seen: set[int] = set()
    late = 0
    for key, index in pairs:
        if index in seen:
            continue
        seen.add(index)
        if index < highest.get(key, -1):
            late += 1
        else:
            highest[key] = index
    return late


def summarize(
    runs: dict[str, dict[str, dict[str, Any]]],
    bare: dict[str, dict[int, float | None]],
    workloads: Sequence[Workload],
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per workload and contender: its rate against its ceiling and its Parallel Consumer."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for w in workloads:
        row: dict[str, dict[str, Any]] = {}
        by_name = runs.get(w.name, {})
        for name, got in by_name.items():
            family, n = got["family"], got["n"]
            rate = got.get("records_per_second")
            lanes = w.keys if family in KEY_ORDERED else None
            top = ceiling(n, w.latency_ms, bare.get(f"{w.latency_ms:g}", {}).get(n), lanes)
            anchor = PC_ANCHOR.get(family)
            pc = by_name.get(f"{anchor}-{n}", {}) if anchor else {}
            row[name] = {
                "family": family,
                "n": n,
                "records_per_second": rate,
                "ceiling": round(top, 1),
                "x_ceiling": ratio(rate, top),
                "x_pc": ratio(rate, pc.get("records_per_second")),
                "overlaps": got.get("overlaps"),
                "out_of_order": got.get("out_of_order"),
                "cpu_us_per_record": got.get("cpu_us_per_record"),
                "rss_mib_max": got.get("rss_mib_max"),
                "status": got.get("status"),
            }
        out[w.name] = row
    return out


def goals(
    summary: dict[str, dict[str, dict[str, Any]]], workloads: Sequence[Workload]
) -> list[dict[str, Any]]:
    """Issue 37's goals, each checked where the run has what it needs (reported, not asserted)."""
    out: list[dict[str, Any]] = []

    def add(goal: str, workload: str, name: str, value: Any, met: bool | None) -> None:
        out.append(
            {"goal": goal, "workload": workload, "contender": name, "value": value, "met": met}
        )

    for w in workloads:
        row = summary.get(w.name, {})
        for name, e in row.items():
            family = e["family"]
            if not family.startswith("offtake") or family in ("offtake-c1", *BASELINES):
                continue  # the goals are this checkout's (a baseline is read beside it)
            if w.partitions == 1 and w.latency_ms == 20 and w.keys >= 1000:
                x = e["x_ceiling"]
                add(
                    ">= 0.8x ceiling (1 partition, 20 ms)",
                    w.name,
                    name,
                    x,
                    None if x is None else x >= 0.8,
                )
            if e["x_pc"] is not None or e["records_per_second"]:
                x = e["x_pc"]
                add(
                    ">= Parallel Consumer (same N, order)",
                    w.name,
                    name,
                    x,
                    None if x is None else x >= 1.0,
                )
            if family == "offtake-key":
                add(
                    "0 overlapping calls of one key",
                    w.name,
                    name,
                    e["overlaps"],
                    None if e["overlaps"] is None else e["overlaps"] == 0,
                )
    # RSS: each Offtake contender at the most keys against the fewest, same partitions/latency.
    fewest, most = (min(w.keys for w in workloads), max(w.keys for w in workloads))
    if most >= 100_000 and fewest < most:
        for lat in sorted({w.latency_ms for w in workloads}):
            for p in sorted({w.partitions for w in workloads}):
                small = summary.get(Workload(p, fewest, lat).name, {})
                large = summary.get(Workload(p, most, lat).name, {})
                for name, e in large.items():
                    if not name.startswith("offtake") or name not in small:
                        continue
                    a, b = small[name]["rss_mib_max"], e["rss_mib_max"]
                    grew = None if a is None or b is None else round(b - a, 1)
                    add(
                        f"RSS at {most:,} keys within 50 MiB of {fewest:,}",
                        Workload(p, most, lat).name,
                        name,
                        grew,
                        None if grew is None else grew <= 50,
                    )
    return out


def _cell(value: Any, width: int, fmt: str = "") -> str:
    if value is None:
        return f"{'-':>{width}}"
    return f"{value:>{width}{fmt}}"


def render(report: dict[str, Any]) -> str:
    load = report["load_average"]
    lines = [
        f"Kafka {report['kafka_version']}; {report['cpus']} CPUs, load average (1, 5, 15 min) "
        f"{load['start']} at start, {load['end']} at end (shared machine: read the ratios)",
        f"per run: up to {report['seconds_per_run']:g} s of output, the first "
        f"{report['warmup_seconds']:g} s not measured; {report['records']:,} input records a "
        "workload",
        "",
        "ceiling: the bare asyncio client alone against the service, calls/s",
    ]
    if report.get("baseline"):
        lines.insert(2, f"offtake-*-base: the worker of {report['baseline']}")
    if report.get("pinned_cpus"):
        lines.insert(2, f"every contender held to CPUs {report['pinned_cpus']} (taskset)")
    for latency, by_n in report["bare_client"].items():
        cells = ", ".join(f"N={n}: {rate:,.0f}" for n, rate in by_n.items() if rate)
        lines.append(f"  {latency} ms: {cells}")
    lines += [
        "",
        f"{'workload':<18} {'contender':<20} {'records/s':>10} {'ceiling':>9} {'x ceil':>7} "
        f"{'x PC':>6} {'overlaps':>9} {'late':>6} {'cpu us':>8} {'RSS MiB':>8}  status",
    ]
    for workload, row in report["summary"].items():
        for name, e in row.items():
            rate = e["records_per_second"]
            lines.append(
                f"{workload:<18} {name:<20} "
                + " ".join(
                    (
                        _cell(round(rate) if rate else None, 10, ","),
                        _cell(e["ceiling"], 9, ",.0f"),
                        _cell(e["x_ceiling"], 7, ".2f"),
                        _cell(e["x_pc"], 6, ".2f"),
                        _cell(e["overlaps"], 9),
                        _cell(e["out_of_order"], 6),
                        _cell(e["cpu_us_per_record"], 8, ".1f"),
                        _cell(e["rss_mib_max"], 8, ".1f"),
                    )
                )
                + f"  {e['status']}"
            )
    if report["goals"]:
        lines += ["", "goals (issue 37; reported, not asserted):"]
        for g in report["goals"]:
            mark = {True: "met", False: "NOT met", None: "n/a"}[g["met"]]
            lines.append(
                f"  {mark:<8} {g['goal']:<42} {g['workload']:<18} {g['contender']:<20} {g['value']}"
            )
    if report["unavailable"]:
        lines.append("")
        lines += [f"skipped {name}: {why}" for name, why in report["unavailable"].items()]
    lines += ["", "versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items())]
    return "\n".join(lines)


# -- processes --------------------------------------------------------------------------------
def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Sampled:
    """A contender's process, its output in a log file, its CPU and RSS read from /proc every
    0.2 s (the process's totals only: reading a thousand threads' files would cost the
    contenders CPU on a 2-core machine); stopped with SIGTERM, then SIGKILL."""

    def __init__(
        self, argv: list[str], env: dict[str, str], work: Path, label: str, profile: bool = False
    ) -> None:
        self.log_path = work / f"{label}.log"
        self._out = self.log_path.open("wb")
        # cwd outside the repository: its operator/ folder must not shadow anything.
        self.proc = subprocess.Popen(
            argv, stdout=self._out, stderr=subprocess.STDOUT, env=env, cwd=work
        )
        self._profiler: subprocess.Popen[bytes] | None = None
        if profile and PROFILE_DIR is not None:
            # py-spy attaches to the running worker and writes its profile when it exits:
            # collapsed stacks of the time a thread held the GIL (--gil), one file per run.
            spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            self._profiler = subprocess.Popen(
                [
                    *(spy, "record", "--gil", "--format", "raw", "--rate", "250", "--threads"),
                    *("-o", str(PROFILE_DIR / f"{label}.txt"), "--pid", str(self.proc.pid)),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        self.samples: list[tuple[float, float, int]] = []  # (wall ms, CPU s, RSS bytes)
        # Offtake's threads, each on its own (bench/concurrency_threads.py): (wall ms, counts).
        self.per_thread = profile
        self.thread_samples: list[tuple[float, dict[int, tuple[int, int, int]]]] = []
        self.thread_names: dict[int, str] = {}
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        import concurrency_threads  # beside this file (bench/ is the script's folder)

        tick = os.sysconf("SC_CLK_TCK")
        stat = Path(f"/proc/{self.proc.pid}/stat")
        while self.proc.poll() is None:
            try:
                fields = stat.read_text().rpartition(")")[2].split()
            except OSError:
                return
            # utime, stime: fields 14, 15 of proc(5); rss (pages): field 24.
            cpu = (int(fields[11]) + int(fields[12])) / tick
            rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
            self.samples.append((time.time() * 1000, cpu, rss))
            if self.per_thread:
                snap = concurrency_threads.snapshot(self.proc.pid)
                self.thread_samples.append((time.time() * 1000, snap))
            time.sleep(0.2)

    def name_threads(self) -> None:
        import concurrency_threads

        self.thread_names = concurrency_threads.names(self.proc.pid)

    def threads_between(self, start_ms: float, end_ms: float, records: int) -> dict[str, Any]:
        before = [snap for at, snap in self.thread_samples if at <= start_ms]
        after = [snap for at, snap in self.thread_samples if at >= end_ms]
        if not before or not after:
            return {}
        seconds = (end_ms - start_ms) / 1000
        import concurrency_threads

        return concurrency_threads.per_record(
            before[-1], after[0], self.thread_names, records, seconds
        )

    def cpu_between(self, start_ms: float, end_ms: float) -> float | None:
        before = [cpu for at, cpu, _ in self.samples if at <= start_ms]
        after = [cpu for at, cpu, _ in self.samples if at >= end_ms]
        return after[0] - before[-1] if before and after else None

    def rss_max(self) -> int | None:
        return max((rss for _, _, rss in self.samples), default=None)

    def exited(self) -> int | None:
        return self.proc.poll()

    def stop(self, timeout: float = 60.0) -> tuple[int, bool]:
        killed = False
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
                killed = True
        if self._profiler is not None:
            try:
                self._profiler.wait(60)  # writes its file once the worker is gone
            except subprocess.TimeoutExpired:
                self._profiler.kill()
        self._out.close()
        return self.proc.returncode, killed

    def tail(self, lines: int = 12) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Prepared:
    """How to start the contenders that can run here, and why the others cannot."""

    arroyo_python: Path | None = None
    pc_command: list[str] | None = None
    versions: dict[str, str] | None = None
    unavailable: dict[str, str] | None = None


def prepare(families: Sequence[str]) -> Prepared:
    import importlib.metadata

    from passthrough import Unavailable, _venv_version, venv_python

    out = Prepared(versions={}, unavailable={})
    assert out.versions is not None and out.unavailable is not None
    out.versions["python"] = sys.version.split()[0]
    for package in ("confluent-kafka", "aiohttp"):
        try:
            out.versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out.versions[package] = "missing"
    if "arroyo" in families:
        try:
            out.arroyo_python = venv_python(ARROYO_REQUIREMENT)
            out.versions["sentry-arroyo"] = ARROYO_REQUIREMENT.split("==")[1]
            out.versions["confluent-kafka (arroyo)"] = _venv_version(
                out.arroyo_python, "confluent-kafka"
            )
        except Unavailable as exc:
            out.unavailable["arroyo"] = str(exc)
    if any(f.startswith("pc-") for f in families):
        sys.path.insert(0, str(BENCH / "parallel_consumer"))
        import build as pc_build

        try:
            out.pc_command = pc_build.command(pc_build.install())
            out.versions["parallel-consumer-core"] = pc_build.PARALLEL_CONSUMER_VERSION
            java = subprocess.run(
                [out.pc_command[0], "-version"], capture_output=True, text=True, check=False
            )
            out.versions["java"] = (java.stderr.splitlines() or ["?"])[0]
        except (pc_build.BuildError, OSError) as exc:
            for family in ("pc-key", "pc-none"):
                out.unavailable[family] = str(exc)
    for family, why in out.unavailable.items():
        log(f"skipping {family}: {why}")
    return out


def offtake_manifest(
    c: Contender, bootstrap: str, source: str, output: str, group: str
) -> dict[str, Any]:
    processor: dict[str, Any]
    if c.family == "offtake-c1":
        processor = {"function": "concurrency_calls:offtake_sync"}
    elif c.family == "offtake-threads":
        processor = {
            "function": "concurrency_calls:offtake_sync",
            "concurrency": c.n,
            "order": "none",
        }
    else:
        processor = {
            "function": "concurrency_calls:offtake_async",
            "lifespan": "concurrency_calls:http_session",
            "concurrency": c.n,
            "order": c.order,
        }
    return {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": "bench", "namespace": "bench"},
        "spec": {
            "kafka": {"bootstrapServers": bootstrap},
            "source": {"topics": [source], "groupId": group, "format": "bytes"},
            "processor": processor,
            "sink": {"kafka": {"topic": output}},
            # The bench stops each run once measured: a long drain only lengthens the run.
            "shutdown": {"drainTimeoutSeconds": 5},
        },
    }


def command(
    c: Contender,
    prepared: Prepared,
    bootstrap: str,
    source: str,
    output: str,
    group: str,
    service_url: str,
    work: Path,
) -> tuple[list[str], dict[str, str]]:
    """argv and environment of contender ``c``, held to ``--cpus`` if given."""
    argv, env = _command(c, prepared, bootstrap, source, output, group, service_url, work)
    return (argv if PINNED is None else ["taskset", "-c", PINNED, *argv]), env


def _command(
    c: Contender,
    prepared: Prepared,
    bootstrap: str,
    source: str,
    output: str,
    group: str,
    service_url: str,
    work: Path,
) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    env["OFFTAKE_BENCH_SERVICE"] = service_url
    if c.family.startswith("offtake"):
        manifest = work / f"{group}.yaml"
        # JSON is YAML: no YAML library needed to write the manifest.
        manifest.write_text(json.dumps(offtake_manifest(c, bootstrap, source, output, group)))
        # A *-base contender: the worker of the --baseline checkout instead of this one's.
        ours = env.get("PYTHONPATH", "")
        if c.family in BASELINES:
            assert BASELINE is not None
            ours = str(BASELINE / "worker")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (ours, str(BENCH)) if p)
        argv = [sys.executable, "-m", "offtake.cli", "worker", "--pipeline", str(manifest)]
        return [*argv, "--metrics-port", "0", "--log-level", "WARNING"], env
    if c.family == "arroyo":
        assert prepared.arroyo_python is not None
        env.pop("PYTHONPATH", None)  # the venv's own packages only
        argv = [str(prepared.arroyo_python), str(BENCH / "concurrency_contenders.py"), "arroyo"]
        argv += ["--bootstrap", bootstrap, "--input", source, "--output", output]
        return [*argv, "--group", group, "--concurrency", str(c.n)], env
    assert prepared.pc_command is not None
    ordering = "KEY" if c.order == "key" else "UNORDERED"
    argv = [*prepared.pc_command, "--bootstrap", bootstrap, "--input", source]
    argv += ["--output", output, "--group", group, "--ordering", ordering]
    return [*argv, "--concurrency", str(c.n), "--service", service_url], env


# -- Kafka ------------------------------------------------------------------------------------
def record_value(i: int) -> bytes:
    """The input's i-th value: its index first (the output's order check reads it back)."""
    head = b"%d|" % i
    return head + b"x" * max(0, VALUE_BYTES - len(head))


def record_key(i: int, keys: int) -> bytes:
    return b"k%d" % (i % keys)


def fill(bootstrap: str, topic: str, records: int, keys: int) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 50, "queue.buffering.max.messages": 500_000}
    )
    for i in range(records):
        while True:
            try:
                producer.produce(topic, record_value(i), key=record_key(i, keys))
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError(f"could not fill {topic}")


# -- one run ----------------------------------------------------------------------------------
def run_one(
    broker: Any,
    service: Any,
    prepared: Prepared,
    c: Contender,
    w: Workload,
    source: str,
    settings: Settings,
    work: Path,
) -> dict[str, Any]:
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

    from offtake_testbed.kafka import read_topic

    tag = f"{w.name}-{c.name}".replace(".", "_")
    output = f"out-{tag}"
    broker.create_topic(output, w.partitions, config={"message.timestamp.type": "LogAppendTime"})
    group = f"bench-{tag}-{uuid.uuid4().hex[:6]}"
    service.reset(w.latency_ms)
    argv, env = command(c, prepared, broker.bootstrap, source, output, group, service.url, work)
    process = Sampled(argv, env, work, tag, profile=c.family.startswith("offtake"))
    status = "ok"
    began = time.monotonic()
    # (wall ms, calls answered): the service's count, sampled as the run goes.
    served: list[tuple[float, int]] = []
    # (wall ms, CPU s of the broker, of the service): what a contender costs the machine
    # beside its own process (2 cores: the broker and the service share them with it).
    beside: list[tuple[float, float, float]] = []
    broker_process = getattr(broker, "_process", None)
    broker_pid = broker_process.pid if broker_process is not None else None
    first_at: float | None = None
    progress_at = began
    named = False
    try:
        while True:
            code = process.exited()
            if code is not None:
                status = f"exited {code}"
                break
            now = time.monotonic()
            count = service.stats().served
            if served and count > served[-1][1]:
                progress_at = now
                if first_at is None:
                    first_at = now
            if process.per_thread and not named and first_at and now - first_at > 2:
                process.name_threads()  # every thread runs by now
                named = True
            served.append((time.time() * 1000, count))
            beside.append((time.time() * 1000, _cpu_of(broker_pid), _cpu_of(service.pid)))
            if count >= settings.records:
                break  # the input is done
            if first_at is not None and now - first_at >= settings.warmup + settings.seconds:
                break
            if now - progress_at > 120:
                status = "stalled" if first_at else "no call in 120 s"
                break
            time.sleep(0.2)
    finally:
        code, killed = process.stop()
    stats = service.stats()
    result: dict[str, Any] = {
        "family": c.family,
        "n": c.n,
        "order": c.order,
        "status": status if not killed else f"{status}, killed on stop",
        "exit_code": code,
        "served": stats.served,
        "overlaps": stats.overlaps,
        "in_flight_max": stats.in_flight_max,
        "keys_in_flight_max": stats.keys_in_flight_max,
    }
    if status.startswith(("exited", "no call")):
        result["log_tail"] = process.tail()
        text = process.log_path.read_text(errors="replace")
        if (
            c.family.startswith("offtake")
            and code == 2
            and ("concurrency" in text or "lifespan" in text or "order" in text)
        ):
            result["status"] = "not supported by this engine"
    messages = read_topic(broker.bootstrap, output, timeout=180)
    broker.delete_topic(output, missing_ok=True)
    times: list[int] = []
    pairs: list[tuple[bytes | None, int]] = []
    for m in messages:
        kind, stamp = m.timestamp()
        if kind != TIMESTAMP_LOG_APPEND_TIME:
            raise RuntimeError(f"{output}: expected log-append timestamps, got {kind}")
        times.append(stamp)
        pairs.append((m.key(), int((m.value() or b"-1|").split(b"|", 1)[0])))
    rate, start_ms, end_ms, measured = calls_rate(served, settings.warmup)
    cpu = process.cpu_between(start_ms, end_ms) if rate else None
    rss = process.rss_max()
    # The output's rate over the same window: what reached the sink, against the calls made
    # (a contender that writes its output in bursts reads lower here over a short window).
    written = sum(1 for t in times if start_ms <= t <= end_ms) if rate else 0
    result.update(
        records_per_second=round(rate, 1) if rate else None,
        measured_calls=measured,
        measured_seconds=round((end_ms - start_ms) / 1000, 2) if rate else None,
        output_records=len(times),
        output_per_second=round(written / ((end_ms - start_ms) / 1000), 1) if rate else None,
        out_of_order=out_of_order(pairs),
        cpu_us_per_record=round(cpu / measured * 1e6, 1) if cpu and measured else None,
        rss_mib_max=round(rss / 2**20, 1) if rss else None,
        wall_seconds=round(time.monotonic() - began, 1),
    )
    if rate:
        before = [b for b in beside if b[0] <= start_ms]
        after = [b for b in beside if b[0] >= end_ms]
        if before and after and measured:
            b0, a0 = before[-1], after[0]
            result["broker_cpu_us_per_record"] = round((a0[1] - b0[1]) / measured * 1e6, 1)
            result["service_cpu_us_per_record"] = round((a0[2] - b0[2]) / measured * 1e6, 1)
    if rate and process.per_thread:
        result["threads"] = process.threads_between(start_ms, end_ms, measured)
    if result["status"] == "ok" and not rate:
        result["status"] = "too few calls to measure"
    return result


def _cpu_of(pid: int | None) -> float:
    """A process's CPU seconds so far (user + system), 0.0 if it cannot be read."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_ceilings(
    service: Any, settings: Settings, work: Path
) -> dict[str, dict[int, float | None]]:
    """The bare asyncio client at each N (and 1, offtake-c1's) per latency, alone."""
    out: dict[str, dict[int, float | None]] = {}
    ns = sorted({1, *settings.ns})
    for latency in settings.latencies_ms:
        by_n: dict[int, float | None] = {}
        for n in ns:
            service.reset(latency)
            env = dict(os.environ, OFFTAKE_BENCH_SERVICE=service.url)
            argv = [sys.executable, str(BENCH / "concurrency_contenders.py"), "ceiling"]
            argv += ["--concurrency", str(n), "--seconds", str(settings.ceiling_seconds)]
            done = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=300, check=False, cwd=work
            )
            got: dict[str, Any] = {}
            try:
                got = json.loads(done.stdout.strip().splitlines()[-1])
                by_n[n] = round(got["calls"] / got["seconds"], 1)
            except (IndexError, ValueError, KeyError, ZeroDivisionError):
                log(f"ceiling N={n} at {latency:g} ms failed: {done.stderr[-500:]}")
                by_n[n] = None
            cpu = got.get("cpu_us_per_call")
            CEILING_CPU.setdefault(f"{latency:g}", {}).setdefault(n, []).append(cpu)
            log(f"ceiling {latency:g} ms N={n}: {by_n[n]} calls/s, {cpu} us of CPU a call")
        out[f"{latency:g}"] = by_n
    return out


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    stamp = datetime.datetime.now(datetime.UTC)
    suffix = "-quick" if settings.quick else ""
    out_path = settings.json or BENCH / "results" / f"concurrency{suffix}-{stamp:%Y-%m-%d}.json"
    started = time.monotonic()
    load_start = [round(x, 2) for x in os.getloadavg()]
    prepared = prepare(settings.families)
    assert prepared.unavailable is not None and prepared.versions is not None
    contenders = [c for c in settings.contenders() if c.family not in prepared.unavailable]
    workloads = settings.workloads()

    from offtake_testbed.kafka import KAFKA_VERSION, KafkaBroker
    from offtake_testbed.latency_service import LatencyService

    work = Path(tempfile.mkdtemp(prefix="offtake-bench-concurrency-"))
    runs: dict[str, dict[str, dict[str, Any]]] = {}
    try:
        with LatencyService(settings.latencies_ms[0]) as service:
            before = measure_ceilings(service, settings, work)
            with KafkaBroker() as broker:
                for w in workloads:
                    source = f"in-{w.name}".replace(".", "_")
                    broker.create_topic(source, w.partitions)
                    records = max(settings.records, w.keys)
                    fill(broker.bootstrap, source, records, w.keys)
                    log(f"filled {source}: {records:,} records, {w.keys:,} keys")
                    runs[w.name] = {}
                    for c in contenders:
                        got = run_one(broker, service, prepared, c, w, source, settings, work)
                        runs[w.name][c.name] = got
                        log(f"{w.name:<18} {c.name:<20} {_describe(got)}")
                    broker.delete_topic(source, missing_ok=True)
            # Again after the Kafka runs, the better kept: on a shared machine the other jobs
            # only ever take from a measurement.
            after = measure_ceilings(service, settings, work)
            bare = best_of(before, after)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = summarize(runs, bare, workloads)
    report: dict[str, Any] = {
        "date": stamp.isoformat(timespec="seconds"),
        "kafka_version": KAFKA_VERSION,
        "cpus": os.cpu_count(),
        "load_average": {"start": load_start, "end": [round(x, 2) for x in os.getloadavg()]},
        "seconds": round(time.monotonic() - started),
        "settings": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()
        },
        "records": settings.records,
        "baseline": None if BASELINE is None else str(BASELINE),
        "pinned_cpus": PINNED,
        "seconds_per_run": settings.seconds,
        "warmup_seconds": settings.warmup,
        "versions": prepared.versions,
        "unavailable": prepared.unavailable,
        "throughput_measure": (
            "calls the service answered (sampled every 0.2 s) from the first call + warm-up to "
            "the stop, over that window; output_per_second: output records appended in it"
        ),
        "ceiling_measure": (
            "min(N / latency, the bare asyncio client's calls/s at N in flight against the same "
            "service, alone, before the Kafka runs)"
        ),
        "cpu_measure": "CPU s (user + system, all threads) over the window / measured records",
        "bare_client": bare,
        "bare_client_rounds": {"before": before, "after": after},
        "bare_client_cpu_us_per_call": CEILING_CPU,
        "threads_measure": (
            "Offtake runs' threads (bench/concurrency_threads.py): CPU us per record and "
            "voluntary context switches (wake-ups) per second, per thread name, over the window"
        ),
        "summary": summary,
        "goals": goals(summary, workloads),
        "runs": runs,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    print(f"\nfigures: {out_path}  ({report['seconds']} s)")
    return 0


def _describe(got: dict[str, Any]) -> str:
    rate = got.get("records_per_second")
    head = f"{rate:>9,.0f} records/s" if rate else f"{'-':>9} records/s"
    text = (
        f"{head}  overlaps {got['overlaps']}  late {got['out_of_order']}  "
        f"in flight max {got['in_flight_max']}  cpu {got.get('cpu_us_per_record')} us  "
        f"rss {got.get('rss_mib_max')} MiB  {got['status']}"
    )
    if got.get("broker_cpu_us_per_record") is not None:
        text += (
            f"\n    beside it: broker cpu {got['broker_cpu_us_per_record']} us/record, "
            f"service cpu {got.get('service_cpu_us_per_record')} us/record"
        )
    for name, t in (got.get("threads") or {}).items():
        text += (
            f"\n    {name:<20} cpu {t['cpu_us_per_record']} us/record  "
            f"wake-ups {t['wakeups_per_second']}/s ({t['wakeups_per_record']}/record)  "
            f"preempted {t['preempted_per_second']}/s"
        )
    if got.get("log_tail") and not rate:
        text += "\n" + got["log_tail"][-600:]
    return text


if __name__ == "__main__":
    sys.exit(main())
