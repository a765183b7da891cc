"""Scenario 4 of docs/reliability.md: the operator SIGKILLed while it reconciles."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Protocol

from offtake_testbed.process import terminate

from ..manifest_corpus import one_replica
from ..workers import REPO
from .common import Outcome

_CHILD_KINDS = "deployments,configmaps,services,poddisruptionbudgets"


class Kube(Protocol):
    @property
    def kubeconfig(self) -> Path: ...

    def kubectl(
        self, *args: str, check: bool = ..., input: str | None = ..., timeout: float = ...
    ) -> subprocess.CompletedProcess[str]: ...


def apply_crd(kube: Kube) -> None:
    """Apply the ConsumerPipeline CRD and wait until the API server serves it."""
    kube.kubectl("apply", "-f", str(REPO / "crds" / "consumerpipeline.yaml"))
    # Right after apply the CRD may have no status.conditions yet, and kubectl wait then
    # fails at once ("accessor error") instead of waiting: ask again until it answers.
    deadline = time.monotonic() + 90
    while (
        kube.kubectl(
            "wait",
            "--for=condition=Established",
            "crd/consumerpipelines.offtake.dev",
            "--timeout=10s",
            check=False,
        ).returncode
        != 0
    ):
        if time.monotonic() > deadline:
            raise AssertionError("the ConsumerPipeline CRD was not established in 90 s")
        time.sleep(1)


def _start_operator(kube: Kube, namespace: str, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "KUBECONFIG": str(kube.kubeconfig),
        "OFFTAKE_LAG_SOURCE": "off",  # no broker behind these pipelines
        "OFFTAKE_RESYNC_SECONDS": "60",
        "OFFTAKE_LIVENESS_ENDPOINT": "",
        "OFFTAKE_NAMESPACES": namespace,
    }
    with log.open("ab") as out:
        return subprocess.Popen(["offtake-operator"], env=env, stdout=out, stderr=subprocess.STDOUT)


def _children(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    done = kube.kubectl(
        "get", _CHILD_KINDS, "-n", namespace, "-l", "offtake.dev/pipeline", "-o", "json"
    )
    items: list[dict[str, Any]] = json.loads(done.stdout)["items"]
    return items


def _pipelines(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    done = kube.kubectl("get", "consumerpipelines", "-n", namespace, "-o", "json")
    items: list[dict[str, Any]] = json.loads(done.stdout)["items"]
    return items


def operator_kills(
    kube: Kube, namespace: str, workdir: Path, *, pipelines: int, kills: int, every: float = 2.0
) -> Outcome:
    """``pipelines`` pipelines applied at once; the operator (its own process, as in its pod)
    is SIGKILLed ``kills`` times while it reconciles them, each time restarted. While it is
    down, a fifth of the pipelines get replicas 2 and a tenth are deleted. After the last
    restart every pipeline must converge (status.observedGeneration = generation, its
    Deployment at the replicas asked for) with exactly one child of each kind, and no child
    may be left without its pipeline."""
    names = [f"chaos-{i:03d}" for i in range(pipelines)]
    docs = "\n---\n".join(json.dumps(one_replica(n)) for n in names)
    log = workdir / "operator.log"
    operator = _start_operator(kube, namespace, log)
    began = time.monotonic()
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=docs, timeout=300)
    scaled = names[: max(1, pipelines // 5)]
    deleted = names[-max(1, pipelines // 10) :]
    fault_times: list[float] = []
    try:
        for k in range(kills):
            time.sleep(every)
            operator.kill()
            operator.wait()
            fault_times.append(time.monotonic())
            if k == 0:  # changes the operator must find when it is back
                for name in scaled:
                    kube.kubectl(
                        "patch",
                        "consumerpipeline",
                        name,
                        "-n",
                        namespace,
                        "--type=merge",
                        "-p",
                        '{"spec": {"replicas": 2}}',
                    )
                kube.kubectl(
                    "delete", "consumerpipeline", "-n", namespace, "--wait=false", *deleted
                )
            operator = _start_operator(kube, namespace, log)
        want = {n: (2 if n in scaled else 1) for n in names if n not in deleted}
        deadline = time.monotonic() + 300
        problems: list[str] = ["not checked yet"]
        while problems and time.monotonic() < deadline:
            assert operator.poll() is None, log.read_text(errors="replace")[-3000:]
            problems = _convergence_problems(kube, namespace, want)
            if problems:
                time.sleep(1.0)
        converged = time.monotonic()
    finally:
        terminate(operator, 30)
    assert not problems, f"{len(problems)} problems after 300s, e.g. {problems[:5]}"
    duplicated, orphaned = _duplicates_and_orphans(kube, namespace)
    return Outcome(
        f"4. operator SIGKILLed while reconciling {pipelines} pipelines",
        pipelines,
        f"{kills} operator SIGKILLs {every:g}s apart; {len(scaled)} pipelines scaled and "
        f"{len(deleted)} deleted while it was down",
        kills,
        orphaned,
        duplicated,
        0,
        converged - fault_times[-1] if fault_times else converged - began,
        notes=[
            f"all {len(want)} pipelines converged {converged - began:.1f}s after they were applied",
            "lost = children left without their pipeline; duplicated = extra children",
        ],
    )


def _convergence_problems(kube: Kube, namespace: str, want: dict[str, int]) -> list[str]:
    problems = []
    found = {p["metadata"]["name"]: p for p in _pipelines(kube, namespace)}
    deployments = {
        c["metadata"]["labels"]["offtake.dev/pipeline"]: c
        for c in _children(kube, namespace)
        if c["kind"] == "Deployment"
    }
    for name, replicas in want.items():
        p = found.get(name)
        if p is None:
            problems.append(f"{name}: gone")
            continue
        status = p.get("status") or {}
        if status.get("observedGeneration") != p["metadata"].get("generation"):
            problems.append(f"{name}: observedGeneration {status.get('observedGeneration')}")
        d = deployments.get(name)
        if d is None or d["spec"].get("replicas") != replicas:
            problems.append(
                f"{name}: deployment {None if d is None else d['spec'].get('replicas')}"
            )
    extra = set(found) - set(want)
    problems += [f"{name}: not deleted" for name in extra]
    stale = set(deployments) - set(want)
    problems += [f"{name}: deployment of a deleted pipeline" for name in stale]
    return problems


def _duplicates_and_orphans(kube: Kube, namespace: str) -> tuple[int, int]:
    """(children beyond one per kind and pipeline, children whose owner pipeline is gone)."""
    live = {p["metadata"]["uid"] for p in _pipelines(kube, namespace)}
    per: dict[tuple[str, str], int] = {}
    orphans = 0
    for c in _children(kube, namespace):
        key = (c["kind"], c["metadata"]["labels"]["offtake.dev/pipeline"])
        per[key] = per.get(key, 0) + 1
        owners = {o.get("uid") for o in c["metadata"].get("ownerReferences") or []}
        if not owners & live:
            orphans += 1
    return sum(n - 1 for n in per.values()), orphans
