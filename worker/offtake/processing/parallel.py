"""``processor.parallelism: N``: the processing function in N processes, for CPU-bound code.

One Python process runs one function call at a time (the GIL); a CPU-heavy function then
caps a worker at one core whatever the pod's limits. Here a pool of N processes (started with
``spawn``: forking a process that runs librdkafka's threads is unsafe) each imports the
function once; a batch of records is cut into N contiguous slices, one per process, and the
outcomes come back in the records' order. Ordering and commits are therefore the engine's as
with one process: results are routed in consumption order, and offsets commit only once the
sink confirmed them.

Records and results cross a process boundary, so both must pickle: a function returning
something that does not fails that record with an error saying so.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from typing import Any

from offtake.processing.base import Outcome, Processor
from offtake.processing.function import (
    BatchFunctionProcessor,
    FunctionProcessor,
    load_function,
)
from offtake.records import Record

_processor: Processor | None = None  # in each pool process: the function, loaded once


def _load(path: str, batch: bool) -> None:
    global _processor
    function = load_function(path)
    _processor = BatchFunctionProcessor(function) if batch else FunctionProcessor(function)


def _process(records: list[Record]) -> list[tuple[list[Any], BaseException | None]]:
    assert _processor is not None, "pool process not initialised"
    out: list[tuple[list[Any], BaseException | None]] = []
    for o in _processor.process(records):
        out.append((o.values, o.error))
    return out


class ParallelFunctionProcessor(Processor):
    """Runs ``processor.function`` in ``processes`` processes; outcomes in record order."""

    def __init__(self, path: str, processes: int, batch: bool = False) -> None:
        load_function(path)  # a wrong path fails here, in the worker, with the field named
        self.processes = processes
        context = multiprocessing.get_context("spawn")
        self._pool = context.Pool(processes, initializer=_load, initargs=(path, batch))

    def process(self, records: Sequence[Record]) -> list[Outcome]:
        batch = list(records)
        if not batch:
            return []
        size = -(-len(batch) // self.processes)  # ceiling: at most one slice per process
        slices = [batch[i : i + size] for i in range(0, len(batch), size)]
        try:
            results = self._pool.map(_process, slices)
        except Exception as exc:  # a result that does not pickle, or a pool process died
            return [Outcome([], _explain(exc))] * len(batch)
        return [Outcome(values, error) for part in results for values, error in part]

    def close(self) -> None:
        self._pool.terminate()
        self._pool.join()


def _explain(exc: Exception) -> Exception:
    return RuntimeError(
        f"processor.parallelism: the function's process could not run the batch or return its "
        f"results ({type(exc).__name__}: {exc}); results must be picklable"
    )
