"""Calls of the processor off the processing thread, many at once (processor.concurrency).

Two executors, one interface (:class:`Calls`): the processing thread starts calls, each a
token and its records (one record, or a chunk for a batch function or a sidecar), and finished
calls are handed to the ``done`` callback given to :meth:`Calls.open`, on the executor's own
thread, as a list of (token, the call's outcomes or the exception the processor raised). The
callback only queues them: the processing thread stays the one that routes outcomes and calls
the sink.

Crossing threads costs more than the bookkeeping of a call (a lock, a wake-up of the other
thread, the GIL handed over and back), so it is done a batch at a time both ways: the
processing thread hands a list of calls to :meth:`Calls.start`, and :class:`AsyncCalls` hands
back the calls that finished in one pass of the event loop as one list (one wake-up of the
processing thread, however many calls a pass finished).

- :class:`AsyncCalls`: ``async def`` functions, as tasks on the worker's event loop
  (:mod:`offtake.processing.event_loop`), up to ``concurrency`` at once, and as many again
  waiting on the loop (:attr:`Calls.ahead`): a call that finishes starts the next waiting one
  in the same pass of the loop, as a bare asyncio client's worker task would, instead of its
  slot waiting for the round trip through the processing thread (the hand-back, the routing
  of the outcomes, the next start: passes of a thread that shares the GIL with a busy loop).
  Safe for every order: what the scheduler hands out is at most one record per lane, so a
  waiting call is never behind a call of its own key.
- :class:`ThreadCalls`: anything else (a plain function, a batch function, a sidecar), on up
  to ``threads`` daemon threads, started as calls need them. Daemon: a call that never
  returns (a thread cannot be killed) must not keep the process from exiting after the drain.

Neither decides what runs: that is the scheduler's job (:mod:`offtake.engine.scheduler`).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence

from offtake.processing.base import Outcome, Processor
from offtake.processing.function import AsyncFunctionProcessor
from offtake.records import Record

# A finished call: its token and its outcomes, or what the processor raised.
Finished = tuple[int, "list[Outcome] | BaseException"]
# Where finished calls go, a list at a time.
Done = Callable[[list[Finished]], None]
Call = tuple[int, Sequence[Record]]


class Calls(ABC):
    # Calls the executor takes beyond the ``concurrency`` it runs at once, and starts itself
    # as running ones finish (0: it is handed only what it can start now).
    ahead = 0

    @abstractmethod
    def open(self, done: Done) -> None:
        """Register the callback finished calls go to (before the first :meth:`start`)."""

    @abstractmethod
    def start(self, calls: list[Call]) -> None:
        """Start these calls; each finishes through the ``done`` callback, in any order, alone
        or with others that finished at about the same time."""

    @abstractmethod
    def close(self, timeout: float) -> None:
        """Abandon the calls still running (their results are never routed) and stop."""


def make_calls(processor: Processor, concurrency: int) -> Calls:
    """The executor for ``processor`` with up to ``concurrency`` calls in flight."""
    if isinstance(processor, AsyncFunctionProcessor):
        return AsyncCalls(processor, concurrency)
    return ThreadCalls(processor, concurrency)


class AsyncCalls(Calls):
    def __init__(self, processor: AsyncFunctionProcessor, concurrency: int | None = None) -> None:
        """``concurrency``: calls running at once, as many again taken to wait on the loop;
        None: every call handed over starts at once."""
        self.processor = processor
        self.concurrency = concurrency
        self.ahead = concurrency or 0
        self._done: Done | None = None
        self._closed = False  # set by close(): waiting calls never start
        # On the loop only: the calls running, by token (strong references: the loop keeps
        # only weak ones to its tasks), the calls waiting for a free slot (oldest first), and
        # the calls finished since the last hand-back.
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._waiting: deque[Call] = deque()
        self._finished: list[Finished] = []

    def open(self, done: Done) -> None:
        self._done = done

    def start(self, calls: list[Call]) -> None:
        # One hop to the loop for the whole list: a call_soon_threadsafe per call would cost
        # a wake-up of the loop's selector each.
        self.processor.event_loop.loop.call_soon_threadsafe(self._spawn, calls)

    def _spawn(self, calls: list[Call]) -> None:  # on the loop
        self._waiting.extend(calls)
        self._run_waiting()

    def _run_waiting(self) -> None:  # on the loop
        waiting = self._waiting
        if self._closed:
            waiting.clear()
            return
        loop = self.processor.event_loop.loop
        tasks, call = self._tasks, self._call
        free = len(waiting) if self.concurrency is None else self.concurrency - len(tasks)
        for _ in range(min(free, len(waiting))):
            token, records = waiting.popleft()
            tasks[token] = loop.create_task(call(token, records))

    async def _call(self, token: int, records: Sequence[Record]) -> None:  # on the loop
        try:
            result: list[Outcome] | BaseException = await self.processor.aprocess(records)
        except asyncio.CancelledError as exc:  # abandoned at close: handed back all the same
            self._finish(token, exc)  # and no waiting call takes its slot
            raise
        except Exception as exc:  # handed back: the processing thread decides
            result = exc
        self._finish(token, result)
        if self._waiting:  # its slot goes to the oldest waiting call, now
            self._run_waiting()

    def _finish(self, token: int, result: list[Outcome] | BaseException) -> None:  # on the loop
        del self._tasks[token]
        finished = self._finished
        finished.append((token, result))
        if len(finished) == 1:
            # The first of this pass: hand back at the start of the loop's next pass, with
            # every call that finishes in this one.
            self.processor.event_loop.loop.call_soon(self._hand_back)

    def _hand_back(self) -> None:  # on the loop
        finished, self._finished = self._finished, []
        assert self._done is not None
        self._done(finished)

    def close(self, timeout: float) -> None:
        # The calls waiting never start (the loop reads the flag before it starts one); the
        # tasks are cancelled with the loop, which the processor owns (its close, at the
        # worker's shutdown, after this stage stopped).
        self._closed = True


class ThreadCalls(Calls):
    def __init__(self, processor: Processor, threads: int) -> None:
        self.processor = processor
        self.threads = threads
        self._done: Done | None = None
        self._jobs: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._started: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a job (under _lock)

    def open(self, done: Done) -> None:
        self._done = done

    def start(self, calls: list[Call]) -> None:
        with self._lock:
            wanted = min(self.threads, len(self._started) + max(0, len(calls) - self._idle))
            for _ in range(wanted - len(self._started)):
                thread = threading.Thread(
                    target=self._serve, name=f"offtake-call-{len(self._started)}", daemon=True
                )
                self._started.append(thread)
                thread.start()
        for call in calls:
            self._jobs.put(call)

    def _serve(self) -> None:
        done = self._done
        assert done is not None
        process = self.processor.process
        while True:
            with self._lock:
                self._idle += 1
            job = self._jobs.get()
            with self._lock:
                self._idle -= 1
            if job is None:
                return
            token, records = job
            try:
                result: list[Outcome] | BaseException = process(records)
            except BaseException as exc:  # handed back: the processing thread decides
                result = exc
            done([(token, result)])

    def close(self, timeout: float) -> None:
        try:
            while True:  # calls not started yet never start
                self._jobs.get_nowait()
        except queue.Empty:
            pass
        for _ in self._started:
            self._jobs.put(None)
        # Threads in a call past the drain budget are left to finish into nothing (daemons).
        for thread in self._started:
            thread.join(timeout / max(1, len(self._started)))
