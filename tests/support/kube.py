"""Small helpers for tests against the real control plane (kubectl through the testbed)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from offtake_operator.context import OperatorContext
from offtake_operator.embedded import OperatorThread
from offtake_operator.settings import OperatorConfig
from offtake_testbed.kube import ControlPlane, KubectlError
from offtake_testbed.pytest_plugin_kube import Kubectl

T = TypeVar("T")


def wait_for(
    check: Callable[[], T | None],
    *,
    timeout: float = 60.0,
    what: str = "",
    explain: Callable[[], str] | None = None,
) -> T:
    """Poll until ``check`` returns something truthy; fail naming what was awaited, and with
    ``explain()`` (the state worth seeing: a timeline, log tails) when given."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
            last = result
        except (KeyError, IndexError, AssertionError, KubectlError) as exc:
            last = exc
        time.sleep(0.3)
    detail = f"\n{explain()}" if explain is not None else ""
    pytest.fail(f"timed out after {timeout:g}s waiting for {what or check}; last: {last!r}{detail}")


def wait_for_passes(
    ctx: OperatorContext, namespace: str, name: str, count: int = 2, *, timeout: float = 120.0
) -> None:
    """Wait until the operator has finished ``count`` more reconcile passes of the pipeline
    (resyncs among them). A test that checks the operator leaves something alone waits on
    passes having run, not on a sleep that a loaded machine may not fill with a single one."""
    state = ctx.states.get((namespace, name))
    last = float("-inf") if state is None else state.last_reconcile
    passes = 0

    def enough() -> bool:
        nonlocal last, passes
        state = ctx.states.get((namespace, name))  # read only: the operator's thread owns it
        now = float("-inf") if state is None else state.last_reconcile
        if now > last:  # one pass or more since the last look: counted as one
            passes, last = passes + 1, now
        return passes >= count

    wait_for(enough, timeout=timeout, what=f"{count} more reconcile passes of {namespace}/{name}")


def get(kubectl: Kubectl, *args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


def exists(kubectl: Kubectl, *args: str) -> bool:
    return (
        kubectl("get", *args, "--ignore-not-found", "-o", "name", check=False).stdout.strip() != ""
    )


def patch(
    kubectl: Kubectl, ns: str, target: str, change: Any, *, kind: str = "merge", check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``kubectl patch <target> --type=<kind>`` with ``change`` (a merge patch, or the list of
    operations of a JSON patch) sent as JSON."""
    return kubectl(
        "patch", target, "-n", ns, f"--type={kind}", "-p", json.dumps(change), check=check
    )


def consumer_pipeline(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A ConsumerPipeline manifest (no namespace: ``kubectl apply -n`` gives it)."""
    return {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": name},
        "spec": spec,
    }


@contextlib.contextmanager
def operator_running(
    control_plane: ControlPlane, config: OperatorConfig
) -> Iterator[OperatorContext]:
    """The operator, in this process, on ``control_plane`` for the with block."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBECONFIG", str(control_plane.kubeconfig))
        with OperatorThread(config) as ctx:
            yield ctx
