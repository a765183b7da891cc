"""SIGTERM and SIGINT for ``offtake worker``, from its first moment.

Kubernetes stops a pod with SIGTERM whenever it likes, also while the worker is still starting
(reading its manifest, importing the processing function, waiting for the brokers or the
processor container). Python's default for SIGTERM ends the process at once (exit 143, shown
as an error). So the CLI installs these handlers before it imports anything slow; a stop that
arrives before there is a worker to stop is remembered and handed to the worker as soon as it
exists, and the start-up steps give up at their next check: the worker exits 0 having
consumed nothing. A second signal means "now": the process exits 128 + N at once.

Only the standard library here, so that importing it costs nothing (pyproject.toml's
import-linter layers put it at the bottom).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType


class StopSignals:
    """Remembers the first SIGTERM/SIGINT and forwards it to the stop of whoever runs."""

    def __init__(self) -> None:
        self.received: int | None = None  # the first signal's number
        self.signalled = threading.Event()  # any signal arrived (also after ``finished``)
        self.finished = threading.Event()  # the worker ended: a signal only ends a wait then
        self._stop: Callable[[str], None] | None = None

    def install(self) -> StopSignals:
        """Handle SIGTERM and SIGINT from now on. Only the main thread may set handlers (and
        only it receives signals): called elsewhere (a test running ``main`` on a thread),
        this leaves them as they are."""
        if threading.current_thread() is not threading.main_thread():
            return self
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        # `kill -USR1 <pid>` prints every thread's stack to stderr and the worker goes on:
        # where a stalled worker is stuck, without a debugger in the pod.
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
        return self

    @property
    def reason(self) -> str:
        return f"received {signal.Signals(self.received).name}" if self.received else ""

    def forward_to(self, stop: Callable[[str], None]) -> None:
        """From now on a signal calls ``stop``; one that came already is passed on now."""
        self._stop = stop
        if self.received is not None:
            stop(self.reason)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signalled.set()
        if self.finished.is_set():
            return  # drained on request: the signal only ends the CLI's wait for it
        if self.received is not None:
            # A second signal: the operator (or a person) wants out now, drain or not.
            os._exit(128 + signum)
        self.received = signum
        if self._stop is not None:
            self._stop(self.reason)
