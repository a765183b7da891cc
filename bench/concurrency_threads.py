"""Per-thread counts of an Offtake contender of bench/concurrency.py: CPU and wake-ups.

Counting measures move less with the machine's load than rates do: how much CPU each thread
of the worker spent per record, and how often it went to sleep and woke again (its voluntary
context switches: a wait on a condition, a selector, a lock, the GIL). Read from
``/proc/<pid>/task/<tid>/stat`` and ``status`` every 0.2 s (an Offtake worker has about 20
threads; the Parallel Consumer's thousand are not read), and named once by ``py-spy dump``
(``offtake-processing``, ``offtake-asyncio``, ``MainThread``: the poll loop); the threads
py-spy does not list are librdkafka's (named by the kernel, ``rdk:broker1`` ...), summed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

# tid -> (utime + stime in ticks, voluntary switches, involuntary switches)
Snapshot = dict[int, tuple[int, int, int]]
_DUMPED = re.compile(r'^Thread (\d+) \([^)]*\): "([^"]*)"', re.MULTILINE)


def snapshot(pid: int) -> Snapshot:
    out: Snapshot = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            fields = Path(f"{base}/stat").read_text().rpartition(")")[2].split()
            status = Path(f"{base}/status").read_text()
        except OSError:
            continue
        switches = {
            k: int(v)
            for k, _, v in (line.partition(":\t") for line in status.splitlines())
            if k in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")
        }
        out[int(tid)] = (
            int(fields[11]) + int(fields[12]),
            switches.get("voluntary_ctxt_switches", 0),
            switches.get("nonvoluntary_ctxt_switches", 0),
        )
    return out


def names(pid: int) -> dict[int, str]:
    """The Python threads' names by tid (py-spy dump), the kernel's name for the others."""
    named: dict[int, str] = {}
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    try:
        done = subprocess.run(
            [spy, "dump", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        named = {int(tid): name for tid, name in _DUMPED.findall(done.stdout)}
    except (OSError, subprocess.TimeoutExpired):
        pass
    for tid in snapshot(pid):
        if tid not in named:
            try:
                comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            except OSError:
                continue
            named[tid] = "librdkafka" if comm.startswith("rdk:") else f"other:{comm}"
    return named


def per_record(
    before: Snapshot, after: Snapshot, named: dict[int, str], records: int, seconds: float
) -> dict[str, Any]:
    """Per thread name (threads of one name summed): CPU us per record, wake-ups per second
    and per record, involuntary switches per second."""
    tick = os.sysconf("SC_CLK_TCK")
    sums: dict[str, list[int]] = {}
    for tid, (cpu, vol, invol) in after.items():
        was = before.get(tid, (0, 0, 0))
        name = named.get(tid, "unnamed")
        acc = sums.setdefault(name, [0, 0, 0])
        acc[0] += cpu - was[0]
        acc[1] += vol - was[1]
        acc[2] += invol - was[2]
    out: dict[str, Any] = {}
    for name, (cpu, vol, invol) in sorted(sums.items()):
        out[name] = {
            "cpu_us_per_record": round(cpu / tick / records * 1e6, 1) if records else None,
            "wakeups_per_second": round(vol / seconds, 1) if seconds else None,
            "wakeups_per_record": round(vol / records, 3) if records else None,
            "preempted_per_second": round(invol / seconds, 1) if seconds else None,
        }
    return out
