"""Scenario 5 of docs/reliability.md: bad payloads and bad processors (fuzzed payloads in
every source format, records too large for the output, processors that raise, hang or leak)."""

from __future__ import annotations

import contextlib
import json
import logging
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from offtake_testbed.kafka import read_topic

from ..cgroups import MemoryCgroup
from ..reports import lost_and_duplicated
from ..workers import WorkerProcess, dead_lettering, end_offsets, manifest, write_manifest
from .common import (
    Bed,
    Outcome,
    ProgressMonitor,
    Sampler,
    all_alive,
    copy_pipeline,
    count_output,
    new_topic,
    rss_mib,
    running,
    start_producing,
)

_log = logging.getLogger("chaos")


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
        took = monitor.wait_for(len(values), timeout, all_alive([worker]))
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
    from ..schemas import PROTOBUF_MESSAGE, order, serializer

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
    src, out, path, group = copy_pipeline(
        bed,
        workdir,
        "oom",
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
