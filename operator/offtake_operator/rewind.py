"""Rewind: reset a pipeline's committed offsets safely, once per ``spec.rewind.id``.

The sequence, one :func:`advance` per reconcile pass (:mod:`offtake_operator.reconcile`):

1. ``spec.rewind.id`` differs from ``status.rewind.lastId``: the rewind is pending; the
   Deployment is rendered with zero replicas (the workers drain, commit and leave the group).
2. Wait until the Deployment has no pods and the consumer group has no members. Offsets of a
   group with live members cannot be altered, and a member would overwrite them on its next
   commit anyway.
3. Alter the offsets with the admin API (earliest, latest, or the first offset at or after a
   timestamp, per partition; :mod:`offtake_operator.group_offsets`).
4. Record the id in ``status.rewind.lastId``; the Deployment gets its replicas back.

Because the decision is recomputed from spec and status on every pass, an operator restart in
the middle resumes the sequence where it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from offtake.contract import PipelineSpec

from .context import OperatorContext
from .kafka_secret import kafka_properties
from .lag import KafkaAccessError
from .operator_spec import Rewind
from .status import Event, now_rfc3339


def pending(request: Rewind | None, status: Mapping[str, Any]) -> bool:
    """Whether ``request`` still has to run (its id is not the last one that completed)."""
    done = (status.get("rewind") or {}).get("lastId")
    return request is not None and request.id != done


@dataclass
class Step:
    """Where one :func:`advance` left the rewind."""

    #: Still pending: the workers stay stopped and the reconcile comes back later.
    waiting: bool
    #: ``status.rewind`` to merge-patch (None values delete fields).
    status: dict[str, Any]
    message: str = ""
    events: list[Event] = field(default_factory=list)


async def advance(
    ctx: OperatorContext,
    namespace: str,
    pipeline: PipelineSpec,
    request: Rewind,
    deployment: Mapping[str, Any],
    old_status: Mapping[str, Any],
) -> Step:
    """One step of a pending rewind, given the Deployment as it is after this pass's apply."""
    events: list[Event] = []
    if (old_status.get("rewind") or {}).get("activeId") != request.id:
        events.append(
            Event(
                "Normal",
                "RewindStarted",
                f"rewind {request.id} to {request.to}: stopping the workers",
            )
        )

    def wait(message: str) -> Step:
        return Step(True, {"activeId": request.id, "message": message}, message, events)

    pods = int((deployment.get("status") or {}).get("replicas") or 0)
    if pods:
        return wait(f"rewind {request.id}: waiting for {pods} worker pod(s) to stop")
    group = pipeline.source.group_id
    try:
        secret = await kafka_properties(ctx.api, namespace, pipeline)
        members = await ctx.kafka.group_members(pipeline, secret)
        if members:
            return wait(
                f"rewind {request.id}: waiting for group {group} to be empty ({members} member(s))"
            )
        # reset_offsets checks the group again: a worker may have joined since.
        offsets = await ctx.kafka.reset_offsets(pipeline, secret, request)
    except KafkaAccessError as exc:
        return wait(f"rewind {request.id}: waiting: {exc}")
    where = (
        request.to if request.timestamp is None else f"{request.to} {request.timestamp.isoformat()}"
    )
    message = f"rewind {request.id}: reset {len(offsets)} partition(s) of group {group} to {where}"
    events.append(Event("Normal", "RewindCompleted", message))
    status = {
        "lastId": request.id,
        "activeId": None,  # merge patch: removes the field
        "to": request.to,
        "completedAt": now_rfc3339(),
        "message": message,
    }
    return Step(False, status, message, events)
