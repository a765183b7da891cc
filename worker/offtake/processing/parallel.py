"""processor.function in pool processes: ``parallelism``, ``timeoutSeconds``, ``maxMemoryMiB``.

One Python process runs one function call at a time (the GIL), and a Python thread cannot be
interrupted; so a CPU-heavy function, one that may hang, or one that leaks memory runs in a
pool of processes (started with ``spawn``: forking a process that runs librdkafka's threads is
unsafe), each of which imports the function once (:mod:`offtake.processing.pool_child`).

A batch of records is cut into contiguous slices, one per process, and the outcomes come back
in the records' order. Ordering and commits are therefore the engine's as with one process:
results are routed in consumption order, and offsets commit only once the sink confirmed them.

- ``timeoutSeconds``: a call running past it (one record's, or with ``processor.batch`` the
  slice's) is killed with its process: those records fail with :class:`ProcessorTimeout`
  (retried, then the error policy: the dead letter's ``offtake.error.class`` names it), a fresh
  process takes the rest of the slice, and the partition moves on.
- ``maxMemoryMiB``: a process past it after a call exits between two calls and is replaced;
  nothing is in flight in it, so nothing is retried.
- A process that dies in a call (a crash, the kernel's OOM killer) fails that call's records
  with :class:`PoolProcessDied`, retried like any error; the rest of the slice goes on.

Records and results cross a process boundary, so both must pickle: a function returning
something that does not fails that record with an error saying so.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from offtake.errors import OfftakeError
from offtake.processing.base import Outcome, Processor
from offtake.processing.function import load_function
from offtake.processing.pool_child import ALL, ONE, READY, RECYCLE, serve
from offtake.records import Record

log = logging.getLogger("offtake.processing")

# How long a fresh process may take to import the function before it counts as dead.
STARTUP_SECONDS = 120.0


class ProcessorTimeout(OfftakeError):
    """A call of processor.function ran past processor.timeoutSeconds and was killed."""


class PoolProcessDied(OfftakeError):
    """The pool process running a call of processor.function died during it."""


class _Slot:
    """One pool process, its pipe, and the batch indices it has yet to report, in order."""

    def __init__(self, pool: FunctionPoolProcessor) -> None:
        self.pool = pool
        self.pending: list[int] = []
        self.deadline = math.inf
        self.ready = False
        self.process, self.conn = self._start()

    def _start(self) -> tuple[BaseProcess, Connection]:
        pool = self.pool
        parent, child = pool.context.Pipe()
        process = pool.context.Process(
            target=serve,
            args=(child, pool.path, pool.batch, pool.max_memory_mib),
            name="offtake-function",
            daemon=True,
        )
        process.start()
        child.close()
        self.ready = False
        return process, parent

    def replace(self) -> None:
        """Kill the process if it still runs and start a fresh one."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)
        self.conn.close()
        self.process, self.conn = self._start()
        self.pool.replaced += 1

    def send(self, batch: list[Record]) -> None:
        """Hand the pending records to the process (a fresh one first waits for READY)."""
        self.deadline = time.monotonic() + (self.pool.timeout if self.ready else STARTUP_SECONDS)
        # A process already gone: receive() finds out (EOF) and replaces it.
        with contextlib.suppress(OSError, ValueError):
            self.conn.send([batch[i] for i in self.pending])

    def unit(self) -> list[int]:
        """The indices of the call in flight: the next record, or with batch the whole slice."""
        return list(self.pending) if self.pool.batch else self.pending[:1]

    def restart_deadline(self) -> None:
        self.deadline = time.monotonic() + self.pool.timeout


class FunctionPoolProcessor(Processor):
    """Runs ``processor.function`` in ``processes`` processes; outcomes in record order."""

    def __init__(
        self,
        path: str,
        processes: int = 1,
        batch: bool = False,
        timeout_seconds: float | None = None,
        max_memory_mib: float | None = None,
    ) -> None:
        load_function(path)  # a wrong path fails here, in the worker, with the field named
        self.path = path
        self.batch = batch
        self.timeout = math.inf if timeout_seconds is None else timeout_seconds
        self.max_memory_mib = max_memory_mib
        self.context = multiprocessing.get_context("spawn")
        self.replaced = 0  # processes replaced (timeouts, deaths, memory recycling)
        self._slots = [_Slot(self) for _ in range(processes)]

    def process(self, records: Sequence[Record]) -> list[Outcome]:
        batch = list(records)
        if not batch:
            return []
        results: list[Outcome | None] = [None] * len(batch)
        size = -(-len(batch) // len(self._slots))  # ceiling: at most one slice per process
        for slot, start in zip(self._slots, range(0, len(batch), size), strict=False):
            slot.pending = list(range(start, min(start + size, len(batch))))
            slot.send(batch)
        while busy := [s for s in self._slots if s.pending]:
            now = time.monotonic()
            expired = [s for s in busy if s.deadline <= now]
            for slot in expired:
                self._timed_out(slot, batch, results)
            if expired:
                continue
            wait_for = min(s.deadline for s in busy) - now
            ready = wait([s.conn for s in busy], None if math.isinf(wait_for) else wait_for)
            for slot in busy:
                if slot.conn in ready:
                    self._receive(slot, batch, results)
        assert all(r is not None for r in results), "a record got no outcome"
        return [r for r in results if r is not None]

    def _receive(self, slot: _Slot, batch: list[Record], results: list[Outcome | None]) -> None:
        try:
            message = slot.conn.recv()
        except (EOFError, OSError):
            self._died(slot, batch, results)
            return
        except Exception as exc:  # a result that pickled in the process but does not unpickle
            self._fail(slot, results, RuntimeError(f"processor.function: {_unreadable(exc)}"))
            slot.restart_deadline()
            return
        kind = message[0]
        if kind == READY:
            slot.ready = True
            slot.restart_deadline()
        elif kind == ONE:
            results[slot.pending.pop(0)] = Outcome(message[1], message[2])
            slot.restart_deadline()
        elif kind == ALL:
            for i, (values, error) in zip(slot.pending, message[1], strict=True):
                results[i] = Outcome(values, error)
            slot.pending = []
        elif kind == RECYCLE:
            log.info(
                "processor.maxMemoryMiB: a function process reached %.0f MiB (bound %g); "
                "replacing it between two calls",
                message[1],
                self.max_memory_mib,
            )
            slot.replace()
            if slot.pending:
                slot.send(batch)

    def _timed_out(self, slot: _Slot, batch: list[Record], results: list[Outcome | None]) -> None:
        if not slot.ready:  # never imported the function: as if it had died
            self._died(slot, batch, results)
            return
        what = "batch of" if self.batch else "call on"
        unit = slot.unit()
        error = ProcessorTimeout(
            f"processor.timeoutSeconds: the function's {what} {_where(batch, unit)} ran past "
            f"{self.timeout:g}s; its process was killed and replaced"
        )
        self._replace_failed(slot, batch, results, error)

    def _died(self, slot: _Slot, batch: list[Record], results: list[Outcome | None]) -> None:
        slot.process.join(10)
        unit = slot.unit()
        error = PoolProcessDied(
            f"processor.function: its process died (exit code {slot.process.exitcode}) "
            f"during the call on {_where(batch, unit)}; a fresh process takes over"
        )
        self._replace_failed(slot, batch, results, error)

    def _replace_failed(
        self, slot: _Slot, batch: list[Record], results: list[Outcome | None], error: Exception
    ) -> None:
        """The call in flight failed with ``error`` and its process is lost: a fresh process
        takes the rest of the slice."""
        log.warning("%s", error)
        self._fail(slot, results, error)
        slot.replace()
        if slot.pending:
            slot.send(batch)

    def _fail(self, slot: _Slot, results: list[Outcome | None], error: Exception) -> None:
        """The call in flight in ``slot`` failed with ``error``: its records' outcome."""
        unit = slot.unit()
        for i in unit:
            results[i] = Outcome([], error)
        del slot.pending[: len(unit)]

    def close(self) -> None:
        for slot in self._slots:
            slot.conn.close()  # the process reads EOF and returns
        for slot in self._slots:
            slot.process.join(2)
            if slot.process.is_alive():
                slot.process.kill()
                slot.process.join(5)


def _where(batch: list[Record], unit: list[int]) -> str:
    first = batch[unit[0]]
    where = f"{first.topic}[{first.partition}]@{first.offset}"
    return where if len(unit) == 1 else f"{len(unit)} records from {where}"


def _unreadable(exc: Exception) -> str:
    return (
        f"its result could not be read back from the pool process ({type(exc).__name__}: "
        f"{exc}); results must be picklable"
    )
