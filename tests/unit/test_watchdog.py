"""The shutdown watchdog ends a process whose call does not return, even while that call
holds the GIL in C (librdkafka #4041/#4884 inside consumer.close()); issue 23, item 7."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from offtake.engine.watchdog import EXIT_WATCHDOG

CHILD = """
import ctypes, logging, sys, time
logging.basicConfig(stream=sys.stderr, level=logging.INFO)
from offtake.engine.watchdog import armed

def {name}():
    {call}

with armed(1.0, "the test's {name}", force=True):
    print("armed", flush=True)
    {name}()
print("returned", flush=True)
time.sleep(3)  # past the bound: a disarmed watchdog must not fire now
print("still alive", flush=True)
"""


def run_child(name: str, call: str) -> tuple[subprocess.CompletedProcess[str], float]:
    script = textwrap.dedent(CHILD.format(name=name, call=call))
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    return done, time.monotonic() - start


def test_a_c_call_holding_the_gil_is_ended_with_the_exit_code_and_its_stack() -> None:
    # ctypes.PyDLL keeps the GIL during the call: no Python thread or handler can run.
    done, took = run_child("blocked_in_c_holding_the_gil", "ctypes.PyDLL(None).sleep(30)")

    assert done.returncode == EXIT_WATCHDOG == 14, done.stderr
    assert took < 10, f"ended after {took:.1f}s, bound 1 s (+1.25 s for the C exit)"
    assert "armed" in done.stdout and "returned" not in done.stdout
    assert "Timeout (0:00:01.250000)!" in done.stderr, done.stderr  # faulthandler: bound + 0.25
    assert "in blocked_in_c_holding_the_gil" in done.stderr, "the stack names the hung call"


def test_a_hang_that_leaves_the_gil_free_is_ended_with_a_log_line_naming_it() -> None:
    done, took = run_child("blocked_without_the_gil", "time.sleep(30)")

    assert done.returncode == EXIT_WATCHDOG, done.stderr
    assert took < 10
    assert (
        "shutdown watchdog: the test's blocked_without_the_gil did not return within 1s "
        "(librdkafka #4041/#4884); ending the process with exit code 14"
    ) in done.stderr
    assert "in blocked_without_the_gil" in done.stderr


def test_a_call_that_returns_in_time_disarms_it() -> None:
    done, _took = run_child("returns_at_once", "time.sleep(0.2)")

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["armed", "returned", "still", "alive"]
    assert "Timeout" not in done.stderr and "watchdog" not in done.stderr
