"""In-process processing: a Python function ``module:callable``, per record or per batch.

``processor.batch: false`` (the default): the function takes one record. ``processor.batch:
true``: it takes a list of records and returns a list with one result per record, in the same
order (:class:`BatchFunctionProcessor`). Either way a result means the same: None drops the
record, a list fans it out to several values, anything else is one value.

An ``async def`` function (:class:`AsyncFunctionProcessor`) is awaited on the worker's event
loop (:mod:`offtake.processing.event_loop`): one call at a time here, many at once with
``processor.concurrency`` (:mod:`offtake.processing.calls`). An awaitable returned by a plain
function is awaited the same way: a coroutine is never a value.

``processor.lifespan`` names what the function's calls share (an HTTP session, a connection
pool): a callable returning a context manager, entered once before the first call
(:meth:`_Awaits.open`; an async one on the worker's event loop, where the calls run) and exited
once at shutdown, after the drain (:meth:`_Awaits.close`).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from types import CoroutineType
from typing import Any

from offtake.errors import OfftakeError
from offtake.processing.base import Backpressure, Outcome, Processor
from offtake.processing.event_loop import EventLoop
from offtake.records import Record

# What a plain function may return to be awaited: a coroutine or a future (an asyncio Task is
# one). Concrete types, so the check costs an isinstance, not an ABC lookup, per record.
AWAITABLES = (CoroutineType, asyncio.Future)
_MAKING = threading.Lock()
log = logging.getLogger("offtake.worker")

ProcessFunction = Callable[[Record], Any]


class FunctionLoadError(OfftakeError, ValueError):
    """processor.function (or processor.lifespan) does not name an importable callable, or the
    lifespan could not be entered."""


def load_function(path: str, field: str = "spec.processor.function") -> Callable[..., Any]:
    """Import ``module:attr`` (attr may be dotted) and check that it is callable; errors name
    ``field``."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise FunctionLoadError(f"{field}: expected module:callable, got {path!r}")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise FunctionLoadError(f"{field}: cannot import module {module_name!r}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise FunctionLoadError(f"{field}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise FunctionLoadError(f"{field}: {path!r} is not callable")
    return target  # type: ignore[no-any-return]


def values_of(result: Any) -> list[Any]:
    """The function's return value as a list: None drops, a list fans out, else one value."""
    if result is None:
        return []
    if isinstance(result, list):
        return result
    return [result]


def is_async(function: Callable[..., Any]) -> bool:
    """Whether calling ``function`` makes a coroutine (an ``async def``, also as a callable
    object's ``__call__``)."""
    call = getattr(function, "__call__", None)  # noqa: B004 (a class's __call__, not callable())
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(call)


LIFESPAN = "spec.processor.lifespan"


class _Awaits:
    """The event loop a processor awaits on: made on first need, closed with the processor;
    and the lifespan (processor.lifespan) its calls share, entered by :meth:`open`."""

    loop: EventLoop | None = None
    lifespan: Callable[[], Any] | None = None
    _entered: Any = None  # the lifespan's context manager, once entered

    def open(self) -> None:
        """Enter the lifespan, once, before the first call: an async context manager on the
        event loop (where async calls run), a plain one on this thread."""
        if self.lifespan is None or self._entered is not None:
            return
        try:
            manager = self.lifespan()
            if hasattr(manager, "__aenter__"):
                self._await(manager.__aenter__())
            elif hasattr(manager, "__enter__"):
                manager.__enter__()
            else:
                raise TypeError(
                    f"it returned {type(manager).__name__}, not a context manager (decorate it "
                    "with contextlib.contextmanager or contextlib.asynccontextmanager)"
                )
        except Exception as exc:  # user code: the worker cannot start without what it opens
            raise FunctionLoadError(f"{LIFESPAN}: entering it failed: {exc}") from exc
        self._entered = manager

    def _loop(self) -> EventLoop:
        if self.loop is None:
            with _MAKING:  # pool threads (processor.concurrency) may ask at once
                if self.loop is None:
                    self.loop = EventLoop()
        return self.loop

    def _await(self, awaitable: Awaitable[Any]) -> Any:
        return self._loop().wait(awaitable)

    def close(self) -> None:
        """Exit the lifespan (after the drain: no call runs any more), then stop the loop."""
        manager, self._entered = self._entered, None
        if manager is not None:
            try:
                if hasattr(manager, "__aexit__"):
                    self._await(manager.__aexit__(None, None, None))
                else:
                    manager.__exit__(None, None, None)
            except Exception as exc:  # shutting down anyway: say what did not close
                log.warning("%s: exiting it failed: %s", LIFESPAN, exc)
        if self.loop is not None:
            self.loop.close()


class FunctionProcessor(_Awaits, Processor):
    """Calls the user's function on each record; an exception fails that record only."""

    def __init__(self, function: ProcessFunction) -> None:
        self.function = function

    def process(self, records: Sequence[Record]) -> list[Outcome]:
        out: list[Outcome] = []
        append, function, new_outcome = out.append, self.function, tuple.__new__
        for record in records:
            try:
                result = function(record)
                if isinstance(result, AWAITABLES):  # returned, not awaited: await it here
                    result = self._await(result)
            except Exception as exc:  # user code: any exception is that record's failure
                append(Outcome([], exc))
                continue
            # values_of() and Outcome(...), inlined: this runs once per record, and a
            # NamedTuple's __new__ is a Python call that costs more than the tuple it makes.
            if result is None:
                append(new_outcome(Outcome, ([], None, True)))
            elif isinstance(result, list):
                append(new_outcome(Outcome, (result, None, True)))
            else:
                append(new_outcome(Outcome, ([result], None, True)))
        return out

    def outcome_of(self, result: Any) -> Outcome:
        """What :meth:`process` makes of a call's ``result``: awaited if it is awaitable."""
        try:
            if isinstance(result, AWAITABLES):  # returned, not awaited: await it here
                result = self._await(result)
        except Exception as exc:  # user code: any exception is that record's failure
            return Outcome([], exc)
        return Outcome(values_of(result))


ProcessBatchFunction = Callable[[list[Record]], Any]


class BatchFunctionProcessor(_Awaits, Processor):
    """Calls the user's function on a list of records; per-record failures stay per record.

    An exception *instance* among the results fails that record alone. An exception raised
    by the call fails no one yet: the function is called again on each record alone, so that
    only the records that fail on their own are retried or dead-lettered, not their batch.
    """

    def __init__(self, function: ProcessBatchFunction, name: str = "processor.function") -> None:
        self.function = function
        self.name = name

    def process(self, records: Sequence[Record]) -> list[Outcome]:
        batch = list(records)
        try:
            results = self.function(batch)
            if isinstance(results, AWAITABLES):
                results = self._await(results)
        except Backpressure as exc:  # "slow down" holds the whole call's records
            return [Outcome([], exc)] * len(batch)
        except Exception as exc:  # user code: find the records that fail, one by one
            if len(batch) == 1:
                return [Outcome([], exc)]
            return [self.process([r])[0] for r in batch]
        return batch_outcomes(results, len(batch), self.name)


def batch_outcomes(results: Any, n: int, name: str) -> list[Outcome]:
    """A batch function's results for ``n`` records as outcomes; a wrong shape fails them all."""
    if not isinstance(results, list) or len(results) != n:
        got = f"{len(results)} results" if isinstance(results, list) else type(results).__name__
        error = ValueError(
            f"{name} (batch: true) must return a list with one result per record: "
            f"got {got} for {n} record(s)"
        )
        return [Outcome([], error)] * n
    return [Outcome([], r) if isinstance(r, Exception) else Outcome(values_of(r)) for r in results]


class AsyncFunctionProcessor(_Awaits, Processor):
    """An ``async def`` function (per record, or per batch with ``batch``), awaited on the
    worker's event loop: :meth:`aprocess` on the loop itself (many calls at once, see
    processing/calls.py), :meth:`process` from the processing thread (one call at a time)."""

    def __init__(
        self, function: Callable[..., Any], batch: bool, name: str = "processor.function"
    ) -> None:
        self.function = function
        self.batch = batch
        self.name = name

    @property
    def event_loop(self) -> EventLoop:
        return self._loop()

    def process(self, records: Sequence[Record]) -> list[Outcome]:
        return self._loop().wait(self.aprocess(records))

    async def aprocess(self, records: Sequence[Record]) -> list[Outcome]:
        """The outcomes of ``records``; on the event loop."""
        if self.batch:
            return await self._batch(list(records))
        if len(records) == 1:  # concurrency's calls: one record, no comprehension's coroutine
            return [await self._one(records[0])]
        return [await self._one(record) for record in records]

    async def _one(self, record: Record) -> Outcome:
        try:
            result = self.function(record)
            while isinstance(result, AWAITABLES):
                result = await result
        except Exception as exc:  # user code: any exception is that record's failure
            return Outcome([], exc)
        return Outcome(values_of(result))

    async def _batch(self, batch: list[Record]) -> list[Outcome]:
        try:
            results = self.function(batch)
            while isinstance(results, AWAITABLES):
                results = await results
        except Backpressure as exc:  # "slow down" holds the whole call's records
            return [Outcome([], exc)] * len(batch)
        except Exception as exc:  # user code: find the records that fail, one by one
            if len(batch) == 1:
                return [Outcome([], exc)]
            return [(await self._batch([r]))[0] for r in batch]
        return batch_outcomes(results, len(batch), self.name)


def function_processor(
    function: Callable[..., Any],
    batch: bool,
    name: str = "processor.function",
    lifespan: Callable[[], Any] | None = None,
) -> Processor:
    """The processor calling ``function``: async or not, per record or per batch; with the
    ``lifespan`` its calls share (entered by ``open()``)."""
    processor: FunctionProcessor | BatchFunctionProcessor | AsyncFunctionProcessor
    if is_async(function):
        processor = AsyncFunctionProcessor(function, batch, name)
    elif batch:
        processor = BatchFunctionProcessor(function, name)
    else:
        processor = FunctionProcessor(function)
    processor.lifespan = lifespan
    return processor


class PassThrough(Processor):
    """No processor configured: every record goes on unchanged."""

    def process(self, records: Sequence[Record]) -> list[Outcome]:
        return [Outcome([r.value]) for r in records]
