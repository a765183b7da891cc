"""One reconcile pass of a ConsumerPipeline: read, validate, render, apply, report.

Level-based: every pass starts from the object as the API server has it now (never from an
event's possibly stale copy), renders every child from scratch and patches what differs. The
same pass runs on create, update, resume, child changes and a periodic resync, so drift,
missed events and operator restarts all end in the same place.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf
from offtake.config import ConfigError, PipelineSpec, parse_pipeline

from . import names, render, rewind
from .apply import Applied, NotOursError, ensure, remove_owned
from .context import OperatorContext
from .kubeapi import (
    CONFIGMAPS,
    DEPLOYMENTS,
    HPAS,
    JSON,
    PDBS,
    PIPELINES,
    SCALEDOBJECTS,
    SECRETS,
    SERVICEMONITORS,
    SERVICES,
    ApiError,
    KubeApi,
    Resource,
)
from .lag import KafkaAccessError
from .operator_spec import OperatorSpec, parse_operator_spec
from .status import Event, Observed, changed, compute_status, now_rfc3339

log = logging.getLogger("offtake.operator")


@dataclass
class Outcome:
    status: JSON = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    #: Come back in this many seconds (a rewind is waiting for the group to empty).
    retry_after: float | None = None
    message: str = ""
    #: The object is gone: nothing was done.
    gone: bool = False


def worker_manifest(body: Mapping[str, Any]) -> JSON:
    """The resource as the loader expects it (metadata trimmed to what it reads)."""
    name, namespace = render.meta(body)
    return {
        "apiVersion": body.get("apiVersion", names.API_VERSION),
        "kind": body.get("kind", names.KIND),
        "metadata": {"name": name, "namespace": namespace},
        "spec": body.get("spec"),
    }


def validate(body: Mapping[str, Any]) -> tuple[PipelineSpec, OperatorSpec]:
    """Parse with the worker's own loader (the same verdict the worker would reach)."""
    try:
        return parse_pipeline(worker_manifest(body)), parse_operator_spec(body.get("spec") or {})
    except ConfigError:
        raise
    except Exception as exc:  # a loader bug must become a condition, not a crashed handler
        raise ConfigError("spec", f"cannot be read: {exc!r}") from exc


async def secret_properties(api: KubeApi, namespace: str, pipeline: PipelineSpec) -> dict[str, str]:
    """librdkafka properties from spec.kafka.secretRef, as the workers get them mounted."""
    ref = pipeline.kafka.secret_ref
    if ref is None:
        return {}
    secret = await api.get(SECRETS, namespace, ref.name)
    if secret is None:
        raise KafkaAccessError(f"spec.kafka.secretRef: Secret {namespace}/{ref.name} not found")
    out: dict[str, str] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            out[key] = base64.b64decode(value).decode().strip()
        except (binascii.Error, UnicodeDecodeError):
            raise KafkaAccessError(
                f"spec.kafka.secretRef: Secret {namespace}/{ref.name} key {key!r} is not UTF-8 text"
            ) from None
    return out


def _describe_error(res: Resource, obj: Mapping[str, Any], exc: ApiError) -> str:
    return f"{res.kind} {obj['metadata']['name']} was rejected: {exc.reason}: {exc.message}"


async def _ensure_child(
    ctx: OperatorContext, res: Resource, obj: Mapping[str, Any], *, fresh: bool = False
) -> Applied:
    try:
        applied = await ensure(ctx.api, res, obj, create_first=fresh)
    except ApiError as exc:
        if exc.retriable:
            raise
        if exc.status == 403 and "being terminated" in exc.message:
            # The namespace is going away, and the pipeline with it: nothing to repair.
            raise NamespaceTerminatingError(str(exc)) from exc
        raise ChildRejectedError(_describe_error(res, obj, exc)) from exc
    ctx.note_written(res, applied.obj)
    return applied


async def _apply_children(
    ctx: OperatorContext, body: Mapping[str, Any], pipeline: PipelineSpec, replicas: int
) -> Applied:
    """Create or patch ConfigMap, Deployment, Service, PDB (and ServiceMonitor); return what
    happened to the Deployment."""
    # A pipeline without any status has never been reconciled: its children most likely do
    # not exist yet, so create before looking.
    fresh = not body.get("status")
    # The ConfigMap first: pods of a Deployment rolled to a new checksum must find the new
    # config when they start. The rest are independent of each other: in parallel.
    await _ensure_child(ctx, CONFIGMAPS, render.render_configmap(body), fresh=fresh)
    children: list[tuple[Resource, JSON]] = [
        (DEPLOYMENTS, render.render_deployment(body, pipeline, ctx.config, replicas=replicas)),
        (SERVICES, render.render_service(body, pipeline)),
        (PDBS, render.render_pdb(body)),
    ]
    if await ctx.serves(SERVICEMONITORS):
        children.append((SERVICEMONITORS, render.render_service_monitor(body)))
    results = await asyncio.gather(
        *(_ensure_child(ctx, res, obj, fresh=fresh) for res, obj in children),
        return_exceptions=True,
    )
    for result in results:
        if isinstance(result, BaseException):
            raise result
    deployment = results[0]
    assert isinstance(deployment, Applied)
    return deployment


async def _apply_autoscaler(
    ctx: OperatorContext,
    body: Mapping[str, Any],
    pipeline: PipelineSpec,
    extras: OperatorSpec,
    old_status: Mapping[str, Any],
) -> str | None:
    """Ensure the HPA or ScaledObject if autoscaling is on; remove ours if it is off.

    Returns the kind in use (recorded in status.autoscaler, so that turning autoscaling off
    later knows there is something to remove without probing on every pass).
    """
    name, namespace = render.meta(body)
    uid = body["metadata"]["uid"]
    partitions = old_status.get("partitions")
    wanted: tuple[Resource, JSON] | None = None
    # Paused: no autoscaler, or it would keep writing spec.replicas behind the user's back.
    if extras.autoscaling.enabled and not pipeline.paused:
        if await ctx.serves(SCALEDOBJECTS):
            wanted = (
                SCALEDOBJECTS,
                render.render_scaled_object(body, pipeline, extras.autoscaling, partitions),
            )
        else:
            wanted = (HPAS, render.render_hpa(body, extras.autoscaling, partitions))
    previous = old_status.get("autoscaler")
    for res in (HPAS, SCALEDOBJECTS):
        if previous == res.kind and (wanted is None or wanted[0] is not res):
            await remove_owned(ctx.api, res, namespace, names.autoscaler_name(name), uid)
    if wanted is None:
        return None
    await _ensure_child(ctx, *wanted)
    return wanted[0].kind


class ChildRejectedError(Exception):
    """The API server refused a rendered child (e.g. a malformed image reference)."""


class NamespaceTerminatingError(Exception):
    """The pipeline's namespace is being deleted: no child can be (re)created there."""


async def _advance_rewind(
    ctx: OperatorContext,
    body: Mapping[str, Any],
    pipeline: PipelineSpec,
    extras: OperatorSpec,
    deployment: Mapping[str, Any],
    old_status: Mapping[str, Any],
    outcome: Outcome,
) -> tuple[bool, str | None]:
    """One step of a pending rewind. Returns (still pending, progress message)."""
    request = extras.rewind
    assert request is not None
    _, namespace = render.meta(body)
    old_rewind = old_status.get("rewind") or {}
    if old_rewind.get("activeId") != request.id:
        outcome.events.append(
            Event(
                "Normal",
                "RewindStarted",
                f"rewind {request.id} to {request.to}: stopping the workers",
            )
        )
    pods = int((deployment.get("status") or {}).get("replicas") or 0)
    if pods:
        return True, f"rewind {request.id}: waiting for {pods} worker pod(s) to stop"
    try:
        secret = await secret_properties(ctx.api, namespace, pipeline)
        members = await ctx.kafka.group_members(pipeline, secret)
        if members:
            group = pipeline.source.group_id
            return (
                True,
                f"rewind {request.id}: waiting for group {group} to be empty ({members} member(s))",
            )
        offsets = await ctx.kafka.reset_offsets(pipeline, secret, request)
    except KafkaAccessError as exc:
        return True, f"rewind {request.id}: waiting: {exc}"
    where = (
        request.to if request.timestamp is None else f"{request.to} {request.timestamp.isoformat()}"
    )
    group = pipeline.source.group_id
    message = f"rewind {request.id}: reset {len(offsets)} partition(s) of group {group} to {where}"
    outcome.status["rewind"] = {
        "lastId": request.id,
        "activeId": None,  # merge patch: removes the field
        "to": request.to,
        "completedAt": now_rfc3339(),
        "message": message,
    }
    outcome.events.append(Event("Normal", "RewindCompleted", message))
    return False, None


async def reconcile(ctx: OperatorContext, namespace: str, name: str) -> Outcome:
    """One full pass for the named pipeline; the caller serialises passes per pipeline."""
    body = await ctx.api.get(PIPELINES, namespace, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return Outcome(gone=True)  # deleted: the garbage collector removes the children
    outcome = Outcome()
    old_status: Mapping[str, Any] = body.get("status") or {}
    generation = body["metadata"].get("generation")
    dep_name = names.deployment_name(name)

    try:
        pipeline, extras = validate(body)
    except ConfigError as exc:
        # Leave the children alone: the workers keep running the last good spec.
        current = await ctx.api.get(DEPLOYMENTS, namespace, dep_name)
        running = int(((current or {}).get("spec") or {}).get("replicas") or 0)
        seen = Observed(name, generation, running, deployment=current, invalid=str(exc))
        return await _finish(ctx, body, old_status, seen, outcome)

    rewinding = rewind.pending(extras.rewind, old_status)
    replicas = render.desired_worker_replicas(pipeline, rewinding=rewinding)
    failed = None
    before: JSON | None = None
    deployment: JSON | None = None
    progress = None
    try:
        applied = await _apply_children(ctx, body, pipeline, replicas)
        before, deployment = applied.before, applied.obj
        if rewinding:
            rewinding, progress = await _advance_rewind(
                ctx, body, pipeline, extras, deployment, old_status, outcome
            )
            if rewinding:
                outcome.status["rewind"] = {
                    "activeId": extras.rewind.id if extras.rewind else None,
                    "message": progress,
                }
                outcome.retry_after = ctx.config.rewind_poll_seconds
                outcome.message = progress or ""
            else:  # done: the workers come back in this same pass
                replicas = render.desired_worker_replicas(pipeline, rewinding=False)
                deployment = (await _apply_children(ctx, body, pipeline, replicas)).obj
        outcome.status["autoscaler"] = await _apply_autoscaler(
            ctx, body, pipeline, extras, old_status
        )
    except NamespaceTerminatingError:
        return Outcome(gone=True)
    except (ChildRejectedError, NotOursError) as exc:
        failed = str(exc)
        deployment = await ctx.api.get(DEPLOYMENTS, namespace, dep_name)
    old_replicas = ((before or {}).get("spec") or {}).get("replicas")
    if before is not None and old_replicas != replicas and failed is None:
        outcome.events.append(Event("Normal", "Scaled", f"workers: {old_replicas} -> {replicas}"))
    seen = Observed(
        name,
        generation,
        replicas,
        paused=pipeline.paused,
        deployment=deployment,
        failed=failed,
        rewinding=progress if rewinding else None,
    )
    return await _finish(ctx, body, old_status, seen, outcome)


async def _finish(
    ctx: OperatorContext,
    body: Mapping[str, Any],
    old_status: Mapping[str, Any],
    seen: Observed,
    outcome: Outcome,
) -> Outcome:
    status, events = compute_status(old_status, seen)
    status.update(outcome.status)
    outcome.status = status
    outcome.events = events + outcome.events
    name, namespace = render.meta(body)
    if changed(old_status, status):
        await ctx.api.patch(PIPELINES, namespace, name, {"status": status}, subresource="status")
    for event in outcome.events:
        ctx.recent_events.append(((namespace, name), event))
        post_event(body, event)
    return outcome


def post_event(body: Mapping[str, Any], event: Event) -> None:
    try:
        kopf.event(
            cast(kopf.Body, body),
            type=event.type,
            reason=event.reason,
            message=event.message[:1000],
        )
    except LookupError:
        # Outside a running operator (unit tests calling reconcile directly): log instead.
        log.info("event %s %s: %s", event.type, event.reason, event.message)


async def refresh_lag(ctx: OperatorContext, namespace: str, name: str) -> bool:
    """Measure lag and write it to status. Returns whether the partition count changed."""
    body = await ctx.api.get(PIPELINES, namespace, name)
    if body is None:
        return False
    try:
        pipeline, _ = validate(body)
    except ConfigError:
        return False  # the reconcile reports it
    state = ctx.state(namespace, name)
    try:
        secret = await secret_properties(ctx.api, namespace, pipeline)
        report = await ctx.kafka.lag(pipeline, secret)
    except KafkaAccessError as exc:
        if state.lag_error != str(exc):
            log.warning("pipeline %s/%s: cannot measure lag: %s", namespace, name, exc)
            state.lag_error = str(exc)
        return False
    state.lag_error = None
    old: Mapping[str, Any] = body.get("status") or {}
    new = {"lag": report.lag, "lagSeconds": report.lag_seconds, "partitions": report.partitions}
    if changed(old, new):
        await ctx.api.patch(PIPELINES, namespace, name, {"status": new}, subresource="status")
    return bool(old.get("partitions") != report.partitions)
