"""The executors of processor.concurrency (offtake.processing.calls): every call started comes
back exactly once, with its outcomes or the exception, and async calls come back a loop pass
at a time (one hand-back, one wake-up of the processing thread, for all the calls that
finished in one pass), not one by one.

Real event loop, real threads; the waits are on conditions (the hand-backs arriving), with a
timeout only as the failure bound.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from offtake.processing.base import Outcome
from offtake.processing.calls import AsyncCalls, Finished, ThreadCalls
from offtake.processing.function import AsyncFunctionProcessor, FunctionProcessor
from offtake.records import Record

WAIT = 30.0  # failure bound only: every wait below ends when its condition holds


def _record(i: int) -> Record:
    return Record(
        topic="t", partition=0, offset=i, key=b"k%d" % i, value=i, headers=(), timestamp=0
    )


class HandBacks:
    """What the executor hands back, list by list, and a wait for a number of calls."""

    def __init__(self) -> None:
        self.lists: list[list[Finished]] = []
        self.threads: set[str] = set()
        self._cond = threading.Condition()

    def __call__(self, finished: list[Finished]) -> None:
        with self._cond:
            self.lists.append(list(finished))
            self.threads.add(threading.current_thread().name)
            self._cond.notify_all()

    def calls(self) -> dict[int, list[Outcome] | BaseException]:
        return {token: result for handed in self.lists for token, result in handed}

    def wait_for(self, n: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: sum(len(h) for h in self.lists) >= n, WAIT), (
                f"{sum(len(h) for h in self.lists)} of {n} calls handed back"
            )


@pytest.fixture
def async_processor() -> Iterator[AsyncFunctionProcessor]:
    async def handle(record: Record) -> object:
        if record.value == 7:
            raise ValueError("seven")
        return record.value

    processor = AsyncFunctionProcessor(handle, batch=False)
    yield processor
    processor.close()


def test_async_calls_finished_in_one_pass_come_back_as_one_list(
    async_processor: AsyncFunctionProcessor,
) -> None:
    calls = AsyncCalls(async_processor)
    back = HandBacks()
    calls.open(back)
    # 50 calls that finish without waiting: started together, they run and finish in one pass
    # of the loop, so they come back together.
    calls.start([(i, [_record(i)]) for i in range(50)])
    back.wait_for(50)
    assert [len(h) for h in back.lists] == [50]
    assert back.threads == {"offtake-asyncio"}  # handed back on the loop's thread
    got = back.calls()
    assert sorted(got) == list(range(50))  # each call once
    first = got[3]
    assert isinstance(first, list) and first[0].values == [3] and first[0].error is None
    failed = got[7]  # the function's exception is the record's outcome, not the call's
    assert isinstance(failed, list) and isinstance(failed[0].error, ValueError)


def test_async_calls_come_back_as_they_finish_in_later_passes(
    async_processor: AsyncFunctionProcessor,
) -> None:
    gates: dict[int, asyncio.Event] = {}

    async def handle(record: Record) -> object:
        gate = gates.setdefault(record.offset, asyncio.Event())
        await gate.wait()
        return record.value

    async_processor.function = handle
    calls = AsyncCalls(async_processor)
    back = HandBacks()
    calls.open(back)
    calls.start([(i, [_record(i)]) for i in range(6)])
    loop = async_processor.event_loop.loop

    def open_gates(offsets: range) -> None:  # on the loop, in one pass
        for i in offsets:
            gates.setdefault(i, asyncio.Event()).set()

    loop.call_soon_threadsafe(open_gates, range(0, 2))
    back.wait_for(2)
    loop.call_soon_threadsafe(open_gates, range(2, 6))
    back.wait_for(6)
    # Two hand-backs: what finished in the first pass, then the rest; none held back for more.
    assert [sorted(t for t, _ in h) for h in back.lists] == [[0, 1], [2, 3, 4, 5]]


def test_async_calls_run_at_most_concurrency_and_start_the_waiting_as_others_finish(
    async_processor: AsyncFunctionProcessor,
) -> None:
    running: set[int] = set()
    most = 0
    gates: dict[int, asyncio.Event] = {}

    async def handle(record: Record) -> object:
        nonlocal most
        running.add(record.offset)
        most = max(most, len(running))
        await gates.setdefault(record.offset, asyncio.Event()).wait()
        running.discard(record.offset)
        return record.value

    async_processor.function = handle
    calls = AsyncCalls(async_processor, concurrency=2)
    assert calls.ahead == 2  # as many again may wait on the loop
    back = HandBacks()
    calls.open(back)
    calls.start([(i, [_record(i)]) for i in range(5)])
    loop = async_processor.event_loop.loop

    def started() -> list[int]:  # read on the loop
        return sorted(running)

    def on_loop(fn: object) -> object:
        return asyncio.run_coroutine_threadsafe(_called(fn), loop).result(WAIT)

    async def _called(fn: object) -> object:
        await asyncio.sleep(0.01)  # a few passes: what could start has started
        return fn() if callable(fn) else None

    assert on_loop(started) == [0, 1]  # two run, three wait, in the order handed over
    for i in range(5):  # each finish starts the oldest waiting call, on the loop itself
        loop.call_soon_threadsafe(lambda i=i: gates.setdefault(i, asyncio.Event()).set())
        back.wait_for(i + 1)
    assert sorted(back.calls()) == list(range(5)) and most == 2


def test_async_calls_waiting_at_close_never_start(
    async_processor: AsyncFunctionProcessor,
) -> None:
    seen: list[int] = []
    gate, first = threading.Event(), threading.Event()

    async def handle(record: Record) -> object:
        seen.append(record.offset)
        first.set()
        await asyncio.get_running_loop().run_in_executor(None, gate.wait, WAIT)
        return record.value

    async_processor.function = handle
    calls = AsyncCalls(async_processor, concurrency=1)
    back = HandBacks()
    calls.open(back)
    calls.start([(1, [_record(1)]), (2, [_record(2)])])
    assert first.wait(WAIT)
    calls.close(1.0)  # the stage stopped: call 2 waits, and never starts
    gate.set()
    back.wait_for(1)
    assert seen == [1] and sorted(back.calls()) == [1]


def test_a_call_whose_processor_breaks_comes_back_as_its_exception(
    async_processor: AsyncFunctionProcessor,
) -> None:
    async def broken(records: list[Record]) -> list[Outcome]:
        raise RuntimeError("processor broke")

    async_processor.aprocess = broken  # type: ignore[method-assign]
    calls = AsyncCalls(async_processor)
    back = HandBacks()
    calls.open(back)
    calls.start([(1, [_record(1)])])
    back.wait_for(1)
    got = back.calls()[1]
    assert isinstance(got, RuntimeError) and str(got) == "processor broke"


def test_calls_cancelled_when_the_loop_closes_come_back_cancelled(
    async_processor: AsyncFunctionProcessor,
) -> None:
    started = threading.Event()

    async def forever(record: Record) -> object:
        started.set()
        await asyncio.Event().wait()
        return None

    async_processor.function = forever
    calls = AsyncCalls(async_processor)
    back = HandBacks()
    calls.open(back)
    calls.start([(1, [_record(1)]), (2, [_record(2)])])
    assert started.wait(WAIT)
    async_processor.event_loop.close()  # abandons them (the drain budget was spent)
    back.wait_for(2)
    got = back.calls()
    assert sorted(got) == [1, 2]
    assert all(isinstance(r, asyncio.CancelledError) for r in got.values())


def test_thread_calls_come_back_each_once_on_their_threads() -> None:
    processor = FunctionProcessor(lambda record: record.value * 2)
    calls = ThreadCalls(processor, threads=4)
    back = HandBacks()
    calls.open(back)
    calls.start([(i, [_record(i)]) for i in range(20)])
    back.wait_for(20)
    calls.close(WAIT)
    got = back.calls()
    assert sorted(got) == list(range(20))
    assert all(isinstance(r, list) and r[0].values == [t * 2] for t, r in got.items())
    assert back.threads <= {f"offtake-call-{i}" for i in range(4)}
