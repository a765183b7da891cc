"""The pipeline's status (phase, counts, conditions) and the Events its transitions deserve.

Pure functions: given what the operator observed, compute the status to write and the Events to
post. Conditions keep their lastTransitionTime while their status stays the same, so a resync
that changes nothing writes nothing.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from . import names

JSON = dict[str, Any]
Phase = Literal["Pending", "Running", "Paused", "Degraded", "Failed"]


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    """What one reconcile saw and did; the input of :func:`compute_status`."""

    name: str
    generation: int | None
    desired_replicas: int
    paused: bool = False
    deployment: Mapping[str, Any] | None = None
    #: The loader's (or the operator's) message for a spec that cannot run.
    invalid: str | None = None
    #: The API server refused a child object the operator rendered.
    failed: str | None = None
    #: A rewind in progress: its status message.
    rewinding: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Counts:
    replicas: int
    ready: int
    updated: int
    stuck: str | None
    rolled_out: bool


def deployment_counts(deployment: Mapping[str, Any] | None) -> Counts:
    if deployment is None:
        return Counts(0, 0, 0, None, False)
    st = deployment.get("status") or {}
    stuck = None
    for cond in st.get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            stuck = cond.get("message") or "the rollout exceeded its progress deadline"
    generation = (deployment.get("metadata") or {}).get("generation")
    seen = st.get("observedGeneration")
    rolled_out = generation is None or (seen is not None and seen >= generation)
    return Counts(
        replicas=int(st.get("replicas") or 0),
        ready=int(st.get("readyReplicas") or 0),
        updated=int(st.get("updatedReplicas") or 0),
        stuck=stuck,
        rolled_out=rolled_out,
    )


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(
    old: Sequence[Mapping[str, Any]],
    ctype: str,
    status: bool,
    reason: str,
    message: str,
    generation: int | None,
    now: str,
) -> JSON:
    text = "True" if status else "False"
    previous = next((c for c in old if c.get("type") == ctype), None)
    since = now
    if (
        previous is not None
        and previous.get("status") == text
        and previous.get("lastTransitionTime")
    ):
        since = previous["lastTransitionTime"]
    cond: JSON = {
        "type": ctype,
        "status": text,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def compute_status(
    old_status: Mapping[str, Any], seen: Observed, now: str | None = None
) -> tuple[JSON, list[Event]]:
    """The new status (the fields this operator owns) and the Events for what changed."""
    now = now or now_rfc3339()
    counts = deployment_counts(seen.deployment)
    desired = seen.desired_replicas
    old_conditions = old_status.get("conditions") or []

    degraded_reason, degraded_message = "AsExpected", "the pipeline runs as specified"
    if seen.failed:
        degraded_reason, degraded_message = "ChildRejected", seen.failed
    elif seen.invalid:
        degraded_reason, degraded_message = "InvalidSpec", seen.invalid
    elif counts.stuck:
        degraded_reason, degraded_message = "RolloutStuck", counts.stuck
    degraded = degraded_reason != "AsExpected"

    enough = counts.ready >= desired and (desired > 0 or counts.replicas == 0)
    workers = f"{counts.ready}/{desired} workers ready"
    if seen.paused:
        ready = _condition(
            old_conditions, "Ready", False, "Paused", "spec.paused is true", seen.generation, now
        )
    elif seen.rewinding:
        ready = _condition(
            old_conditions, "Ready", False, "Rewinding", seen.rewinding, seen.generation, now
        )
    else:
        reason = "WorkersReady" if enough else "WorkersNotReady"
        ready = _condition(old_conditions, "Ready", enough, reason, workers, seen.generation, now)

    if seen.rewinding:
        progressing = (True, "Rewinding", seen.rewinding)
    elif seen.deployment is not None and (
        not counts.rolled_out or counts.updated < desired or counts.replicas != desired
    ):
        progressing = (
            True,
            "RollingOut",
            f"{counts.updated}/{desired} workers updated, {counts.replicas} running",
        )
    else:
        progressing = (False, "Settled", workers)
    conditions = [
        ready,
        _condition(old_conditions, "Progressing", *progressing, seen.generation, now),
        _condition(
            old_conditions,
            "Degraded",
            degraded,
            degraded_reason,
            degraded_message,
            seen.generation,
            now,
        ),
    ]

    phase: Phase
    if seen.failed:
        phase = "Failed"
    elif degraded:
        phase = "Degraded"
    elif seen.paused:
        phase = "Paused"
    elif enough and not seen.rewinding:
        phase = "Running"
    else:
        phase = "Pending"

    message = degraded_message if degraded else (seen.rewinding or workers)
    status: JSON = {
        "phase": phase,
        "replicas": counts.replicas,
        "readyReplicas": counts.ready,
        "updatedReplicas": counts.updated,
        "selector": names.selector_string(seen.name),
        "message": message,
        # The one-word why beside the message (kubectl get's REASON column).
        "reason": degraded_reason if degraded else ready["reason"],
        "conditions": conditions,
        **seen.extra,
    }
    if seen.generation is not None:
        status["observedGeneration"] = seen.generation
    return status, _events(old_status, phase, degraded, degraded_reason, degraded_message, message)


def _events(
    old: Mapping[str, Any],
    phase: Phase,
    degraded: bool,
    reason: str,
    degraded_message: str,
    message: str,
) -> list[Event]:
    old_phase = old.get("phase")
    old_degraded = next(
        (
            c
            for c in old.get("conditions") or []
            if c.get("type") == "Degraded" and c.get("status") == "True"
        ),
        None,
    )
    events: list[Event] = []
    if degraded and (old_degraded is None or old_degraded.get("message") != degraded_message):
        events.append(Event("Warning", reason, degraded_message))
    if phase != old_phase:
        if phase in ("Degraded", "Failed"):
            if not events:
                events.append(Event("Warning", phase, degraded_message))
        else:
            events.append(Event("Normal", phase, message))
    return events


def changed(old: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Whether merge-patching ``old`` with ``patch`` would change it (None deletes a key)."""
    for key, value in patch.items():
        if value is None:
            if old.get(key) is not None:
                return True
        elif isinstance(value, Mapping) and isinstance(old.get(key), Mapping):
            if changed(old[key], value):
                return True
        elif old.get(key) != value:
            return True
    return False
