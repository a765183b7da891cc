"""The test bed's process helpers: finding what a stopped service left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from offtake_testbed.process import descendants, pid_alive


def test_descendants_finds_a_grandchild_in_its_own_session() -> None:
    # The shape of a container under its shim: the grandchild calls setsid, so killing the
    # child's process group would miss it.
    script = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        assert os.getsid(grandchild) == grandchild
        assert descendants([child.pid]) == [grandchild]
        assert child.pid in descendants([os.getpid()])
        assert grandchild in descendants([os.getpid()])
        for pid in [*descendants([child.pid]), child.pid]:
            os.kill(pid, signal.SIGKILL)
        child.wait(10)
        deadline = time.monotonic() + 10
        while _running(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(grandchild)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan waits for init to reap it)."""
    if not pid_alive(pid):
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_descendants_of_a_process_without_children_is_empty() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert descendants([child.pid]) == []
    finally:
        child.kill()
        child.wait()
