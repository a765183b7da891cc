"""The process helpers every test-bed service and test shares: free ports, children that die
with their parent, stopping a child, the tail of its log, and inter-process file locks."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "descendants",
    "die_with_parent",
    "file_lock",
    "file_tail",
    "free_port",
    "pid_alive",
    "port_open",
    "tail",
    "terminate",
]

_log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def free_port(taken: Collection[int] = ()) -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, and none of ``taken`` (ports this
    caller already chose but has not bound yet). Also what a test uses as a closed port."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in taken:
            return port


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


@functools.cache
def _prctl() -> Callable[..., int]:
    import ctypes

    prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    return prctl


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGTERM when this process dies without
    cleaning up (Linux ``PR_SET_PDEATHSIG``), so a killed test run leaves no servers behind.

    The C function is resolved here, in the parent: between fork and exec the child must not
    import or dlopen (librdkafka's threads may hold those locks at fork time); it only makes
    this one call. None off Linux, and off the main thread: the kernel ties the signal to the
    creating *thread*, so a child started from a worker thread would die when that thread ends.
    """
    if (
        not sys.platform.startswith("linux")
        or threading.current_thread() is not threading.main_thread()
    ):
        return None
    prctl = _prctl()

    def set_parent_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return set_parent_death_signal


def terminate(process: subprocess.Popen[Any], timeout: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited after ``timeout`` seconds; reaps it."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _log.warning("%s ignored SIGTERM for %.0fs; killing it", process.args, timeout)
        process.kill()
        process.wait()


def descendants(roots: Collection[int]) -> list[int]:
    """Every live process under ``roots`` (children, grandchildren...), read from /proc, the
    roots excluded. A process that starts its own session (a container's init under its shim)
    is missed by a process-group kill; walking the parent links finds it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            # Field 4 of /proc/PID/stat, after the command name in parentheses (which may
            # itself hold spaces or parentheses: split after the last one).
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = list(roots)
    while todo:
        kids = children.get(todo.pop(), [])
        found.extend(kids)
        todo.extend(kids)
    return found


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (someone else's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def tail(text: str, lines: int) -> str:
    """The last ``lines`` lines of ``text``, for error reports."""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def file_tail(path: Path, lines: int, missing: str = "(no log)") -> str:
    """The last ``lines`` lines of the file ``path``, or ``missing`` if there is none."""
    try:
        return tail(path.read_text(errors="replace"), lines)
    except FileNotFoundError:
        return missing


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive inter-process lock on ``path``, held for the ``with`` block: parallel test
    processes must not install or build the same thing twice."""
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
