"""A memory cgroup: the kernel's own memory limit, the one a pod's ``resources.limits.memory``
becomes (the kubelet puts each container in such a group). Tests put a worker process in one
to see what the kernel's OOM killer does to it, instead of imitating the kill.

cgroup v2 (``memory.max``) or v1 (``memory.limit_in_bytes``), whichever the machine mounts;
creating one needs root, as the kubelet does.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Self

ROOT = Path("/sys/fs/cgroup")


def _v2() -> bool:
    controllers = ROOT / "cgroup.controllers"
    return controllers.exists() and "memory" in controllers.read_text().split()


def unavailable() -> str | None:
    """Why no memory cgroup can be made here (None: one can)."""
    parent = ROOT if _v2() else ROOT / "memory"
    if not (parent / "cgroup.procs").exists():
        return f"no memory cgroup hierarchy mounted under {ROOT}"
    probe = parent / f"offtake-probe-{time.monotonic_ns()}"
    try:
        probe.mkdir()
    except OSError as exc:
        return f"cannot create a memory cgroup under {parent}: {exc}"
    probe.rmdir()
    return None


class MemoryCgroup:
    """A new memory cgroup limited to ``limit_bytes`` without swap, removed on exit (after
    the processes in it are gone)."""

    def __init__(self, name: str, limit_bytes: int) -> None:
        self.v2 = _v2()
        self.path = (ROOT if self.v2 else ROOT / "memory") / name
        self.limit_bytes = limit_bytes

    def __enter__(self) -> Self:
        self.path.mkdir()
        if self.v2:
            self._write("memory.max", self.limit_bytes)
            with contextlib.suppress(OSError):  # no swap accounting: nothing to turn off
                self._write("memory.swap.max", 0)
        else:
            self._write("memory.limit_in_bytes", self.limit_bytes)
            with contextlib.suppress(OSError):
                self._write("memory.memsw.limit_in_bytes", self.limit_bytes)
        return self

    def __exit__(self, *exc: object) -> None:
        for _ in range(50):  # a killed process leaves its group a moment later
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)

    def add(self, pid: int) -> None:
        self._write("cgroup.procs", pid)

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer ended in this group so far."""
        events = self.path / ("memory.events" if self.v2 else "memory.oom_control")
        for line in events.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        raise RuntimeError(f"{events} has no oom_kill count (kernel too old?)")

    def _write(self, name: str, value: int) -> None:
        (self.path / name).write_text(f"{value}\n")
