"""Run the operator inside another program: a thread with its own event loop.

Tests and tools use this to run the real operator (the same handlers as ``offtake-operator``)
next to their own code. It must have its own loop: when kopf stops, it cancels every task of
its loop, which would take the host program's tasks with it.

    with OperatorThread(OperatorConfig(worker_image="offtake:dev")) as ctx:
        ...  # the operator serves the cluster of $KUBECONFIG until the block ends
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from types import TracebackType
from typing import Any

import kopf

from .context import MEMO_KEY, OperatorContext
from .ensure import settled
from .errors import OperatorError
from .kafka_gateway import KafkaGateway
from .settings import OperatorConfig

log = logging.getLogger("offtake.operator")


class OperatorThreadError(OperatorError, RuntimeError):
    """The embedded operator failed to start, crashed, or did not stop in time."""


class OperatorThread:
    def __init__(
        self,
        config: OperatorConfig,
        *,
        kafka: KafkaGateway | None = None,
        priority: int = 0,
    ) -> None:
        self.ctx = OperatorContext(config, kafka=kafka)
        self._priority = priority
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="offtake-operator", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except asyncio.CancelledError:  # as kopf.run: a cancelled operator has stopped
            pass
        except BaseException as exc:  # re-raised in the host thread by start() or stop()
            self._error = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        from . import handlers, webhook  # noqa: F401  (registers the handlers with kopf)

        self._loop = asyncio.get_running_loop()
        config = self.ctx.config
        await kopf.operator(
            clusterwide=not config.namespaces,
            namespaces=config.namespaces,
            standalone=not config.peering,
            peering_name=config.peering or None,
            priority=self._priority,
            stop_flag=self._stop,
            ready_flag=self._ready,
            memo=kopf.Memo({MEMO_KEY: self.ctx}),
            registry=webhook.registry_for(config),
        )

    def start(self, timeout: float = 30.0) -> OperatorContext:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise OperatorThreadError(f"the operator did not start within {timeout:g} s")
        if self._error is not None:
            raise OperatorThreadError(
                f"the operator failed to start: {self._error!r}"
            ) from self._error
        return self.ctx

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel and await the passes' child steps in flight, then stop kopf.

        The steps first: kopf re-raises, as the operator's crash, the exception of any task
        still running when it stops, and a step can end in one its pass would have handled
        (a namespace that a previous test's teardown is deleting)."""
        loop = self._loop
        if loop is not None and self._thread.is_alive():
            cancelled = asyncio.run_coroutine_threadsafe(_cancel_steps(), loop)
            try:
                cancelled.result(timeout)
            except (concurrent.futures.TimeoutError, RuntimeError) as exc:
                # RuntimeError: the loop closed meanwhile (the operator stopped on its own).
                log.warning("the operator's steps in flight were not all cancelled: %r", exc)
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise OperatorThreadError(f"the operator did not stop within {timeout:g} s")
        if self._error is not None:
            raise OperatorThreadError(f"the operator crashed: {self._error!r}") from self._error

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> OperatorContext:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _is_step(task: asyncio.Task[Any]) -> bool:
    """A task running a pass's child step (:func:`.ensure.settled`), not one of kopf's (its
    watchers, workers and daemons run the passes themselves; kopf stops those)."""
    return getattr(task.get_coro(), "cr_code", None) is settled.__code__


async def _cancel_steps() -> None:
    """Cancel the passes' child steps in flight and wait for them to end: their passes end
    with the cancellation, as at any stop; what a step raised instead is logged."""
    steps = [t for t in asyncio.all_tasks() if _is_step(t)]
    for task in steps:
        task.cancel()
    ended = await asyncio.gather(*steps, return_exceptions=True)
    for task, outcome in zip(steps, ended, strict=True):
        if isinstance(outcome, Exception):
            log.info("operator step %s ended on stop with %r", task.get_name(), outcome)
