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
    #: The API server refused a child object the operator rendered, or its name is taken.
    failed: str | None = None
    #: The Ready (False) and Degraded (True) conditions' reason for ``failed``: ChildRejected
    #: (the default), NameTaken (an object the pipeline did not make holds a child's name; it
    #: was left alone).
    failed_reason: str = ""
    #: A rewind in progress: its status message.
    rewinding: str | None = None
    #: mode inject: the pods carrying the worker (instead of a Deployment), and the checksum
    #: of the current configuration (a pod injected with another one runs an older spec).
    pods: Sequence[Mapping[str, Any]] | None = None
    checksum: str = ""
    #: Partitions of the source topics, when known (more consumers than this idle).
    partitions: int | None = None
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


def worker_ready(pod: Mapping[str, Any]) -> bool:
    """Whether the injected worker container of a pod passes its readiness probe."""
    st = pod.get("status") or {}
    for c in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
        if c.get("name") == names.INJECTED_CONTAINER:
            return bool(c.get("ready"))
    return False


def injected_pods(pods: Sequence[Mapping[str, Any]], checksum: str) -> list[JSON]:
    """status.injectedPods: the pods not on their way out, by name."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        injected = (meta.get("annotations") or {}).get(names.INJECTED_ANNOTATION)
        out.append(
            {
                "name": str(meta.get("name")),
                "ready": worker_ready(pod),
                "updated": injected == checksum,
            }
        )
    return sorted(out, key=lambda p: p["name"])


def pod_counts(listed: Sequence[Mapping[str, Any]]) -> Counts:
    return Counts(
        replicas=len(listed),
        ready=sum(1 for p in listed if p["ready"]),
        updated=sum(1 for p in listed if p["updated"]),
        stuck=None,
        rolled_out=True,
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


def _degraded(seen: Observed, stuck: str | None) -> tuple[str, str]:
    """The Degraded condition's (reason, message): "AsExpected" when it is not."""
    if seen.failed:
        return seen.failed_reason or "ChildRejected", seen.failed
    if seen.invalid:
        return "InvalidSpec", seen.invalid
    if stuck:
        return "RolloutStuck", stuck
    return "AsExpected", "the pipeline runs as specified"


def _progressing(
    seen: Observed, injected: bool, counts: Counts, desired: int, workers: str
) -> tuple[bool, str, str]:
    """The Progressing condition's (status, reason, message)."""
    if seen.rewinding:
        return True, "Rewinding", seen.rewinding
    if (seen.deployment is not None or injected) and (
        not counts.rolled_out or counts.updated < desired or counts.replicas != desired
    ):
        return (
            True,
            "RollingOut",
            f"{counts.updated}/{desired} workers updated, {counts.replicas} running",
        )
    return False, "Settled", workers


def _phase(seen: Observed, degraded: bool, enough: bool) -> Phase:
    if seen.failed:
        return "Failed"
    if degraded:
        return "Degraded"
    if seen.paused:
        return "Paused"
    if enough and not seen.rewinding:
        return "Running"
    return "Pending"


def compute_status(
    old_status: Mapping[str, Any], seen: Observed, now: str | None = None
) -> tuple[JSON, list[Event]]:
    """The new status (the fields this operator owns) and the Events for what changed."""
    now = now or now_rfc3339()
    listed = None if seen.pods is None else injected_pods(seen.pods, seen.checksum)
    counts = deployment_counts(seen.deployment) if listed is None else pod_counts(listed)
    # mode inject: the workload decides how many pods there are; each should consume.
    desired = seen.desired_replicas if listed is None else counts.replicas
    old_conditions = old_status.get("conditions") or []

    degraded_reason, degraded_message = _degraded(seen, counts.stuck)
    degraded = degraded_reason != "AsExpected"

    enough = counts.ready >= desired and (desired > 0 or counts.replicas == 0)
    workers = f"{counts.ready}/{desired} workers ready"
    if seen.failed:
        # Not ready until the pipeline's children are all applied: a refused child leaves the
        # workers (if any run) on an earlier rendering, or a paused pipeline's still running;
        # with NameTaken they are not this pipeline's to count. As phase Failed says.
        ready = _condition(
            old_conditions, "Ready", False, degraded_reason, seen.failed, seen.generation, now
        )
    elif seen.paused:
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

    progressing = _progressing(seen, listed is not None, counts, desired, workers)
    conditions = [
        ready,
        _condition(old_conditions, "Progressing", *progressing, seen.generation, now),
        *_excess(old_conditions, seen, counts.replicas, now),
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

    phase = _phase(seen, degraded, enough)
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
    if listed is not None:
        status["injectedPods"] = listed
        if not listed:
            status["message"] = (
                f"no pod is annotated {names.INJECT_ANNOTATION}={seen.name}: nothing consumes"
            )
    if seen.generation is not None:
        status["observedGeneration"] = seen.generation
    events = _events(old_status, phase, degraded, degraded_reason, degraded_message, message)
    excess = next((c for c in conditions if c["type"] == EXCESS), None)
    was = next((c for c in old_conditions if c.get("type") == EXCESS), None)
    if excess is not None and excess["status"] == "True" and (was or {}).get("status") != "True":
        events.append(Event("Warning", EXCESS, excess["message"]))
    return status, events


#: The reason (Ready False, Degraded True) while a child's name is held by an object the
#: pipeline did not make (offtake_operator.apply: it changes nothing on it).
NAME_TAKEN = "NameTaken"

#: mode inject: a condition, True while the workload runs more pods than there are partitions.
EXCESS = "ReplicasExceedPartitions"


def _excess(
    old: Sequence[Mapping[str, Any]], seen: Observed, replicas: int, now: str
) -> list[JSON]:
    if seen.pods is None:
        return []
    if seen.partitions is not None and replicas > seen.partitions:
        message = (
            f"{replicas} pods consume {seen.partitions} partitions: {replicas - seen.partitions} "
            f"workers stay idle (cap the workload's replicas or its HPA's maxReplicas at "
            f"{seen.partitions})"
        )
        return [_condition(old, EXCESS, True, "IdleWorkers", message, seen.generation, now)]
    message = "no more pods than partitions"
    return [_condition(old, EXCESS, False, "WithinPartitions", message, seen.generation, now)]


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


#: status.lagSeconds is written again when it moves by at least this share of the value written
#: (and at least LAG_SECONDS_FLOOR seconds), or when the lag in messages or the partition count
#: changes. While the lag in messages stands still (nothing consumed, nothing produced), the age of
#: the oldest record grows with the clock alone: rewritten every measurement, a thousand such
#: pipelines would cost the API server (and every watcher of pipelines) a write each every
#: OFFTAKE_LAG_INTERVAL_SECONDS for a figure that says what the last one said.
LAG_SECONDS_STEP = 0.25
LAG_SECONDS_FLOOR = 1.0


def lag_changed(old: Mapping[str, Any], measured: Mapping[str, Any]) -> bool:
    """Whether a lag measurement (``lag``, ``lagSeconds``, ``partitions``) is news against the
    status ``old``: a change of the lag in messages, of the partitions, of whether there is a
    lag at all (queue mode has none), or of the lag in seconds by a step (LAG_SECONDS_STEP)."""
    seconds, written = measured.get("lagSeconds"), old.get("lagSeconds")
    if changed(old, {k: v for k, v in measured.items() if k != "lagSeconds"}):
        return True
    if seconds is None or written is None:
        return seconds is not written
    step = max(LAG_SECONDS_FLOOR, LAG_SECONDS_STEP * float(written))
    return abs(float(seconds) - float(written)) >= step


def operator_clients(lag_error: str | None, overridden: Sequence[str]) -> dict[str, Any] | None:
    """status.operatorClients: why the operator has no lag for the pipeline (``lagError``:
    a refused property, a broker that did not answer, a round that gave up) and which of the
    tenant's values its own clients replaced by the operator's bounds (``overridden``). None
    (the field removed) when there is neither; a key without news is None, so a merge patch
    removes what an earlier write said."""
    if lag_error is None and not overridden:
        return None
    return {
        "lagError": None if lag_error is None else lag_error[:1000],
        "overridden": list(overridden) or None,
    }


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
