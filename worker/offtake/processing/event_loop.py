"""The asyncio event loop a worker owns: one loop on its own daemon thread.

``async def`` processing functions run on it (processing/calls.py) and an awaitable returned
by a plain function is awaited on it. Other threads hand it work with :meth:`EventLoop.submit`
(thread-safe); nothing else touches the loop. :meth:`EventLoop.close` cancels what still runs
and stops the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class EventLoop:
    def __init__(self, name: str = "offtake-asyncio") -> None:
        self.loop = asyncio.new_event_loop()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop; its future, to wait on from any other thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def wait(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable`` on the loop and return its result (from another thread only)."""
        return self.submit(_awaited(awaitable)).result()

    def close(self, timeout: float = 2.0) -> None:
        """Cancel the tasks still running (calls abandoned past the drain budget), stop the loop,
        join its thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        # A task that ignores its cancellation: the daemon thread goes with the process.
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            self.submit(_cancel_all()).result(timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
