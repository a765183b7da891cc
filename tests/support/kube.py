"""Small helpers for tests against the real control plane (kubectl through the testbed)."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from offtake_operator.context import OperatorContext
from offtake_operator.embedded import OperatorThread
from offtake_operator.settings import OperatorConfig
from offtake_testbed.kube import ControlPlane
from offtake_testbed.pytest_plugin_kube import Kubectl
from support.waiting import wait_for


def reconcile_passes(
    ctx: OperatorContext, namespace: str, name: str, count: int
) -> Callable[[], bool]:
    """A check that turns true once the operator has finished ``count`` more reconcile passes
    of the pipeline (resyncs among them) than when it was made: for :func:`wait_for` or an
    async poll. Several passes between two looks count as one, so it errs towards more."""
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

    return enough


def wait_for_passes(
    ctx: OperatorContext, namespace: str, name: str, count: int = 2, *, timeout: float = 120.0
) -> None:
    """Wait until the operator has finished ``count`` more reconcile passes of the pipeline
    (resyncs among them). A test that checks the operator leaves something alone waits on
    passes having run, not on a sleep that a loaded machine may not fill with a single one."""
    check = reconcile_passes(ctx, namespace, name, count)
    wait_for(check, timeout=timeout, what=f"{count} more reconcile passes of {namespace}/{name}")


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
