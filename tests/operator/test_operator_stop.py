"""The embedded operator's stop with a pass's child step in flight (issue 41 item 2).

kopf re-raises, as the operator's crash, the exception of any task still running when it
stops. A pass runs its children's steps at once, each in a task; between two e2e tests such a
step ended in NamespaceTerminatingError (the previous test's namespace going away) while the
operator stopped, and the operator thread reported a crash.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kmock_operator import FakeKafka, emulator, write_kubeconfig

from offtake_operator.embedded import OperatorThread
from offtake_operator.ensure import NamespaceTerminatingError, settled
from offtake_operator.settings import OperatorConfig

pytestmark = pytest.mark.asyncio


async def test_a_step_ends_with_its_exception_as_a_value() -> None:
    async def refused() -> None:
        raise NamespaceTerminatingError("namespace t-1 is being terminated")

    task = asyncio.create_task(settled(refused()))
    outcome = await task

    assert task.exception() is None  # nothing for kopf to re-raise
    assert isinstance(outcome, NamespaceTerminatingError)


async def test_stop_cancels_a_step_in_flight_and_reports_no_crash(tmp_path: Path) -> None:
    ended: list[str] = []
    runner = OperatorThread(OperatorConfig(worker_image="offtake:test"), kafka=FakeKafka())

    async def apply_in_a_terminating_namespace() -> None:
        try:
            await asyncio.sleep(3600)  # a write in flight
        except asyncio.CancelledError:
            # Cancelled by stop() itself, before kopf's stop began (not by kopf's sweep of
            # the tasks left after its own stop, seconds later).
            ended.append("cancelled before kopf stopped" if not runner._stop.is_set() else "late")
            # What the API server answers meanwhile: the namespace is being deleted.
            raise NamespaceTerminatingError("namespace t-1 is being terminated") from None

    kubeconfig = tmp_path / "kubeconfig"
    with pytest.MonkeyPatch.context() as mp:
        async with emulator() as server:
            write_kubeconfig(kubeconfig, str(server.url))
            mp.setenv("KUBECONFIG", str(kubeconfig))
            await asyncio.to_thread(runner.start, 15)
            assert runner._loop is not None
            step = asyncio.run_coroutine_threadsafe(
                settled(apply_in_a_terminating_namespace()), runner._loop
            )

            await asyncio.to_thread(runner.stop, 15)  # raises OperatorThreadError on a crash

    assert ended == ["cancelled before kopf stopped"]
    assert isinstance(step.result(0), NamespaceTerminatingError)
    assert not runner.alive
