"""The shutdown watchdog: a worker process whose Kafka client does not return ends anyway.

librdkafka can hang inside ``consumer.close()`` (#4041, #4884) while the calling thread holds
the GIL, so no Python code runs again: not a timer thread, not a signal handler (Python runs
those between bytecodes, on the main thread). What :func:`armed` sets up therefore works
without the GIL where it must, and fires in this order once ``seconds`` have passed:

1. a Python thread logs ``shutdown watchdog: <what> did not return within <n>s`` and ends the
   process with :data:`EXIT_WATCHDOG` (when the hang left the GIL free, this is all there is);
2. a quarter second later, faulthandler's own C thread prints ``Timeout (0:00:01.250000)!`` and
   every thread's Python stack to stderr, the hung call on top of its thread's stack (e.g.
   ``close`` in ``offtake/kafka/source.py``);
3. a second after that, SIGALRM, whose handler is libc's ``_exit`` itself (a C function: it needs
   no GIL, and a handler makes the signal reach a container's PID 1, where the default action
   would be ignored): the process exits with the signal's number, 14, which is
   :data:`EXIT_WATCHDOG`.

The timers are the process's (one itimer, one faulthandler timeout), so only a process that is
a worker of its own enables them (``offtake worker``: :func:`enable`); elsewhere (a worker
inside a test run, which has its own faulthandler timeout) :func:`armed` does nothing.
"""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("offtake.watchdog")

#: The exit code of a process the watchdog ended: SIGALRM's number, which the C handler passes
#: to ``_exit`` (14 on Linux).
EXIT_WATCHDOG = int(signal.SIGALRM)
#: After the Python side's turn, faulthandler's dump; after that, time to write it, the C exit.
_DUMP_AFTER = 0.25
_EXIT_AFTER = 1.25

_enabled = False
_lock = threading.Lock()


def enable() -> None:
    """Let :func:`armed` arm the process-wide timers (a worker process calls this once)."""
    global _enabled
    _enabled = True


def _c_exit_on_alarm() -> int | None:
    """Make SIGALRM call libc's ``_exit(SIGALRM)``; return the previous handler's address."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    previous: int | None = libc.signal(signal.SIGALRM, ctypes.cast(libc._exit, ctypes.c_void_p))
    return previous


def _restore_alarm(previous: int | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(signal.SIGALRM, previous)


@contextmanager
def armed(seconds: float, what: str, *, force: bool = False) -> Iterator[None]:
    """Run the block under the watchdog: if it has not finished after ``seconds``, the process
    ends with :data:`EXIT_WATCHDOG` (see the module docstring). ``what`` names the call, for
    the log line. ``force`` arms it in a process that did not :func:`enable` it (its test)."""
    if not (_enabled or force):
        yield
        return
    message = (
        f"shutdown watchdog: {what} did not return within {seconds:g}s (librdkafka #4041/#4884); "
        f"ending the process with exit code {EXIT_WATCHDOG}"
    )
    done = threading.Event()

    def python_side() -> None:
        if not done.wait(seconds):
            log.critical("%s", message)
            print(f"offtake: {message}", file=sys.stderr, flush=True)
            faulthandler.dump_traceback(all_threads=True)
            os._exit(EXIT_WATCHDOG)

    with _lock:
        previous = _c_exit_on_alarm()
        faulthandler.dump_traceback_later(seconds + _DUMP_AFTER, exit=False)
        signal.setitimer(signal.ITIMER_REAL, seconds + _EXIT_AFTER)
        threading.Thread(target=python_side, name="offtake-watchdog", daemon=True).start()
    try:
        yield
    finally:
        with _lock:
            done.set()
            signal.setitimer(signal.ITIMER_REAL, 0)
            faulthandler.cancel_dump_traceback_later()
            _restore_alarm(previous)
