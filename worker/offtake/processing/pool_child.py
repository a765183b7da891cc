"""What each process of the function pool runs (:mod:`offtake.processing.parallel`).

The process imports ``processor.function`` once, then serves slices of records sent over its
pipe until the pipe closes. Per-record functions report each record's outcome as soon as it
is known, so that the parent knows which record a call that runs past
``processor.timeoutSeconds`` belongs to (the next one not reported). Batch functions
(``processor.batch``) report the slice's outcomes at once: the call is the unit.

``processor.maxMemoryMiB``: after each call the process reads its own resident memory; past
the bound it says so and exits, between two calls, so no record is in flight when it goes
(Celery's ``max_memory_per_child``). The parent starts a fresh process for what is left.
"""

from __future__ import annotations

import os
import resource
from multiprocessing.connection import Connection
from typing import Any

from offtake.processing.base import Outcome, Processor
from offtake.processing.function import (
    BatchFunctionProcessor,
    FunctionProcessor,
    load_function,
)

# Messages from a pool process to its parent.
READY = "ready"  # (READY,): the function is imported; deadlines start counting now
ONE = "one"  # (ONE, values, error): the outcome of the next record of the slice
ALL = "all"  # (ALL, [(values, error), ...]): the outcomes of the whole slice (batch functions)
RECYCLE = "recycle"  # (RECYCLE, rss_mib): past maxMemoryMiB, exiting between two calls


def resident_mib() -> float:
    """This process's resident memory now (Linux), else its peak (other systems)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _send(conn: Connection, message: tuple[Any, ...], outcomes: list[Outcome]) -> None:
    """Send ``message``; if what the function returned does not pickle, send that error."""
    try:
        conn.send(message)  # pickles fully before writing: a failure leaves the pipe intact
    except Exception as exc:  # the function's values or exception cannot cross the pipe
        error = RuntimeError(
            f"processor.function: its result cannot be sent from the pool process "
            f"({type(exc).__name__}: {exc}); results must be picklable"
        )
        if message[0] == ONE:
            conn.send((ONE, [], error))
        else:
            conn.send((ALL, [([], error)] * len(outcomes)))


def serve(conn: Connection, path: str, batch: bool, max_memory_mib: float | None) -> None:
    """The pool process's main loop: slices in, outcomes out, until the pipe closes."""
    function = load_function(path)
    processor: Processor = (
        BatchFunctionProcessor(function) if batch else FunctionProcessor(function)
    )
    conn.send((READY,))
    while True:
        try:
            records = conn.recv()
        except EOFError:  # the parent closed the pool
            return
        for call in [records] if batch else [[r] for r in records]:
            outcomes = processor.process(call)
            if batch:
                _send(conn, (ALL, [(o.values, o.error) for o in outcomes]), outcomes)
            else:
                _send(conn, (ONE, outcomes[0].values, outcomes[0].error), outcomes)
            if max_memory_mib is not None and (rss := resident_mib()) > max_memory_mib:
                conn.send((RECYCLE, rss))
                return
