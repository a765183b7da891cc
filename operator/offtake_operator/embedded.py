"""Run the operator inside another program: a thread with its own event loop.

Tests and tools use this to run the real operator (the same handlers as ``offtake-operator``)
next to their own code. It must have its own loop: when kopf stops, it cancels every task of
its loop, which would take the host program's tasks with it.

    with OperatorThread(OperatorConfig(worker_image="offtake:dev")) as ctx:
        ...  # the operator serves the cluster of $KUBECONFIG until the block ends
"""

from __future__ import annotations

import threading
from types import TracebackType

import kopf

from .context import MEMO_KEY, OperatorContext
from .kafka_gateway import KafkaGateway
from .settings import OperatorConfig


class OperatorError(RuntimeError):
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
        self._thread = threading.Thread(target=self._run, name="offtake-operator", daemon=True)

    def _run(self) -> None:
        from . import handlers, webhook  # noqa: F401  (registers the handlers with kopf)

        config = self.ctx.config
        try:
            kopf.run(
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
        except BaseException as exc:  # re-raised in the host thread by start() or stop()
            self._error = exc
        finally:
            self._ready.set()

    def start(self, timeout: float = 30.0) -> OperatorContext:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise OperatorError(f"the operator did not start within {timeout:g} s")
        if self._error is not None:
            raise OperatorError(f"the operator failed to start: {self._error!r}") from self._error
        return self.ctx

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise OperatorError(f"the operator did not stop within {timeout:g} s")
        if self._error is not None:
            raise OperatorError(f"the operator crashed: {self._error!r}") from self._error

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
