"""Run the real operator (handlers, kopf, the HTTP client) against kmock's Kubernetes emulator."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kmock
import yaml

from offtake.config import PipelineSpec
from offtake.redrive import Counts, RedriveResult
from offtake_operator.context import OperatorContext
from offtake_operator.embedded import OperatorThread
from offtake_operator.lag import TP, LagReport
from offtake_operator.operator_spec import Rewind
from offtake_operator.settings import OperatorConfig

PIPELINES = "offtake.dev/v1alpha1/consumerpipelines"
DEPLOYMENTS = "apps/v1/deployments"
CONFIGMAPS = "v1/configmaps"
SERVICES = "v1/services"
PDBS = "policy/v1/poddisruptionbudgets"
HPAS = "autoscaling/v2/horizontalpodautoscalers"
JOBS = "batch/v1/jobs"
SECRETS = "v1/secrets"


@dataclass
class FakeKafka:
    """Stands in for the broker: canned lag, a group whose members the test controls."""

    lag_report: LagReport = field(
        default_factory=lambda: LagReport(lag=42, lag_seconds=1.5, partitions=6)
    )
    members: int = 0
    resets: list[tuple[str, Rewind]] = field(default_factory=list)
    #: Dead-letter topics that exist, with what a redrive group committed there.
    dlq_totals: dict[str, Counts] = field(default_factory=dict)
    progress_asked: list[tuple[str, str]] = field(default_factory=list)

    async def lag(self, pipeline: PipelineSpec, secret: Mapping[str, str]) -> LagReport:
        return self.lag_report

    async def group_members(self, pipeline: PipelineSpec, secret: Mapping[str, str]) -> int:
        return self.members

    async def reset_offsets(
        self, pipeline: PipelineSpec, secret: Mapping[str, str], request: Rewind
    ) -> dict[TP, int]:
        self.resets.append((pipeline.source.group_id, request))
        return {("orders", 0): 0, ("orders", 1): 0}

    async def redrive_progress(
        self,
        pipeline: PipelineSpec,
        secret: Mapping[str, str],
        group: str,
        topic: str,
        request_id: str,
    ) -> RedriveResult | None:
        self.progress_asked.append((group, topic))
        totals = self.dlq_totals.get(topic)
        return None if totals is None else RedriveResult(group, topic, totals)


def declare_resources(server: Any) -> None:
    res = server.resources
    res[PIPELINES] = kmock.ResourceInfo(
        kind="ConsumerPipeline",
        namespaced=True,
        singular="consumerpipeline",
        shortnames={"cpl"},
        subresources={"status", "scale"},
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
    )
    for key, kind in [
        (DEPLOYMENTS, "Deployment"),
        (CONFIGMAPS, "ConfigMap"),
        (SERVICES, "Service"),
        (PDBS, "PodDisruptionBudget"),
        (HPAS, "HorizontalPodAutoscaler"),
        (JOBS, "Job"),
        (SECRETS, "Secret"),
        ("v1/events", "Event"),
        ("v1/namespaces", "Namespace"),
    ]:
        res[key] = kmock.ResourceInfo(
            kind=kind,
            namespaced=key != "v1/namespaces",
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
        )


def write_kubeconfig(path: Path, url: str) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "kmock",
                "clusters": [{"name": "kmock", "cluster": {"server": url}}],
                "users": [{"name": "kmock", "user": {"token": "test"}}],
                "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
            }
        )
    )


@contextlib.asynccontextmanager
async def running_operator(
    kafka: FakeKafka, config: OperatorConfig
) -> AsyncIterator[OperatorContext]:
    """The operator in its own thread and event loop, as ``offtake_operator.embedded`` runs it;
    the test's loop stays free to serve kmock's emulator meanwhile."""
    runner = OperatorThread(config, kafka=kafka)
    ctx = await asyncio.to_thread(runner.start, 15)
    try:
        yield ctx
    finally:
        await asyncio.to_thread(runner.stop, 15)


@contextlib.asynccontextmanager
async def emulator() -> AsyncIterator[Any]:
    """kmock's Kubernetes emulator on a local port, with the resources the operator uses."""
    async with kmock.KubernetesEmulator() as server, kmock.Server(server):
        declare_resources(server)
        yield server


async def eventually(check: Callable[[], Any], *, timeout: float = 30.0, what: str = "") -> Any:
    """Poll ``check`` until it returns a truthy value without raising; fail with the last error.

    The timeout only bounds a wait that returns as soon as the condition holds: 10 s was too
    little when the machine ran three suites at once (load 25-34: the namespace teardown's
    "orders gone" failed in 2 of 3 runs, and main's copy of the file 13 times in one run)."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if isinstance(result, Awaitable):
                result = await result
            if result:
                return result
        except (KeyError, AssertionError, ValueError, TypeError) as exc:
            last = exc
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or check}: {last!r}")
