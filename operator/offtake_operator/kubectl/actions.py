"""``pause``, ``resume``, ``scale``, ``rewind``, ``redrive``: a change of the pipeline's spec,
then the operator's progress followed until done.

Only the spec changes (a merge patch, or the scale subresource), so RBAC, admission, GitOps
drift detection and the audit log see exactly what ``kubectl patch`` would; the operator does
the work (docs/operator.md, "Pause, scale, rewind" and "Redrive").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .cluster import JSON, Cluster
from .errors import TimedOutError
from .terminal import one_line

Write = Callable[[str], None]


@dataclass(frozen=True)
class Goal:
    """When the operator is done: a test of the pipeline's status, and what it means."""

    what: str
    done: Callable[[Mapping[str, Any]], bool]
    #: The status part the operator reports this change's steps in (rewind, redrive), if any.
    part: str | None = None


def _ready(st: Mapping[str, Any], replicas: int) -> bool:
    return (
        st.get("phase") == "Running"
        and st.get("replicas") == replicas
        and st.get("readyReplicas") == replicas
    )


def pause(cluster: Cluster, name: str) -> Goal:
    cluster.patch_pipeline(name, {"spec": {"paused": True}})
    return Goal(
        "paused: every worker drained, committed and left",
        lambda st: st.get("phase") == "Paused" and not st.get("replicas"),
    )


def resume(cluster: Cluster, name: str) -> Goal:
    manifest = cluster.patch_pipeline(name, {"spec": {"paused": False}})
    replicas = int((manifest.get("spec") or {}).get("replicas", 1))
    return Goal(f"running: {replicas} workers ready", lambda st: _ready(st, replicas))


def scale(cluster: Cluster, name: str, replicas: int) -> Goal:
    cluster.scale_pipeline(name, replicas)
    if replicas == 0:
        return Goal("scaled to 0 workers", lambda st: not st.get("replicas"))
    return Goal(f"running: {replicas} workers ready", lambda st: _ready(st, replicas))


def rewind(cluster: Cluster, name: str, rewind_id: str, to: str, timestamp: str | None) -> Goal:
    body: JSON = {"id": rewind_id, "to": to}
    if timestamp is not None:
        body["timestamp"] = timestamp
    cluster.patch_pipeline(name, {"spec": {"rewind": body}})
    return Goal(
        f"rewind {rewind_id} done",
        lambda st: (st.get("rewind") or {}).get("lastId") == rewind_id,
        "rewind",
    )


def redrive(cluster: Cluster, name: str, redrive_id: str, until: str, source: str | None) -> Goal:
    body: JSON = {"id": redrive_id, "until": until}
    if source is not None:
        body["from"] = source
    cluster.patch_pipeline(name, {"spec": {"redrive": body}})
    return Goal(
        f"redrive {redrive_id} done",
        lambda st: (st.get("redrive") or {}).get("lastId") == redrive_id,
        "redrive",
    )


def _progress(st: Mapping[str, Any], part: str | None) -> str:
    line = (
        f"{st.get('phase', 'Unknown')}, {st.get('readyReplicas', 0)}/{st.get('replicas', 0)} ready"
    )
    # The step of a rewind or redrive says more than the workers' count while it runs.
    step = (st.get(part) or {}).get("message") if part else None
    message = step or st.get("message")
    # One line, whatever the operator's (or a tenant's) message holds.
    return one_line(f"{line}: {message}" if message else line)


def follow(
    cluster: Cluster, name: str, goal: Goal, timeout: float, interval: float, write: Write
) -> Mapping[str, Any]:
    """Print each new state of the pipeline until ``goal`` holds for the new generation."""
    manifest = cluster.pipeline(name)
    generation = int(manifest["metadata"].get("generation") or 0)
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        st = manifest.get("status") or {}
        line = _progress(st, goal.part)
        if line != last:
            write(f"{time.strftime('%H:%M:%S')}  {line}\n")
            last = line
        seen = int(st.get("observedGeneration") or 0)
        if seen >= generation and goal.done(st):
            write(f"done: {goal.what}\n")
            return st
        if time.monotonic() >= deadline:
            raise TimedOutError(
                f"not {goal.what} after {timeout:.0f} s (the change is applied; the operator "
                f"goes on: kubectl offtake status {name})"
            )
        time.sleep(interval)
        manifest = cluster.pipeline(name)
