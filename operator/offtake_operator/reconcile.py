"""One reconcile pass of a ConsumerPipeline: read, validate, render, apply, report.

Level-based: every pass starts from the object as the API server has it now (never from an
event's possibly stale copy), renders every child from scratch and patches what differs. The
same pass runs on create, update, resume, child changes and a periodic resync, so drift,
missed events and operator restarts all end in the same place.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf

from offtake.contract import ConfigError, PipelineSpec, parse_pipeline
from offtake.contract import spark_kubernetes as spark_k8s

from . import group_ids, names, redrive, render, rewind, share_backlog
from .apply import Applied, NotOursError, carries_uid, remove_owned
from .context import OperatorContext
from .ensure import (
    ChildRejectedError,
    NamespaceTerminatingError,
    claim_all,
    ensure_child,
    settled,
)
from .kafka_secret import KafkaSecret, KafkaSecretError, kafka_properties, read_kafka_secret
from .kubeapi import (
    CONFIGMAPS,
    DEPLOYMENTS,
    HPAS,
    JSON,
    NETWORKPOLICIES,
    PDBS,
    PIPELINES,
    PODS,
    PROMETHEUSRULES,
    SCALEDOBJECTS,
    SECRETS,
    SERVICEMONITORS,
    SERVICES,
    SPARKCONNECTS,
    TRIGGERAUTHS,
    ApiError,
    Resource,
)
from .lag import KafkaAccessError, admin_config_overriding
from .operator_spec import OperatorSpec, parse_operator_spec
from .render.worker_network_policy import policy_name, worker_network_policies
from .status import (
    NAME_TAKEN,
    Event,
    Observed,
    changed,
    compute_status,
    lag_changed,
    operator_clients,
)

log = logging.getLogger("offtake.operator")


@dataclass
class ReconcileResult:
    """What one reconcile did: the status to write, Events to post, when to come back."""

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
        pipeline = parse_pipeline(worker_manifest(body))
        extras = parse_operator_spec(body.get("spec") or {})
        render.check_security(body, pipeline)
        return pipeline, extras
    except ConfigError:
        raise
    except Exception as exc:  # a loader bug must become a condition, not a crashed handler
        raise ConfigError("spec", f"cannot be read: {exc!r}") from exc


def validated(ctx: OperatorContext, body: Mapping[str, Any]) -> tuple[PipelineSpec, OperatorSpec]:
    """:func:`validate`, once per spec of the pipeline (the verdict depends on the spec, name
    and namespace only; the spec's JSON is a fraction of the loader's cost)."""
    key = json.dumps(body.get("spec"), sort_keys=True, default=str)
    name, namespace = render.meta(body)
    state = ctx.state(namespace, name)
    if state.validated is None or state.validated[0] != key:
        try:
            checked = validate(body)
            group_ids.check(namespace, checked[0], ctx.config.confine_group_ids)
            state.validated = (key, checked)
        except ConfigError as exc:
            state.validated = (key, exc)
    result = state.validated[1]
    if isinstance(result, ConfigError):
        raise result
    return cast(tuple[PipelineSpec, OperatorSpec], result)


async def _apply_children(
    ctx: OperatorContext,
    body: Mapping[str, Any],
    pipeline: PipelineSpec,
    extras: OperatorSpec,
    secret: KafkaSecret | None,
    replicas: int,
    trusted: bool,
) -> Applied:
    """Apply ConfigMap, Deployment, Service, PDB (and ServiceMonitor); return what happened to
    the Deployment. ``trusted``: see :func:`claim_all`."""
    mounts = None if secret is None else secret.mounts
    derived = None if secret is None else secret.plain
    configmap = render.render_configmap(body, derived)
    rendered = render.render_deployment(
        body, pipeline, ctx.config, replicas=replicas, kafka_mounts=mounts, kafka_config=derived
    )
    children: list[tuple[Resource, JSON]] = [
        (DEPLOYMENTS, rendered),
        (SERVICES, render.render_service(body, pipeline)),
        (PDBS, render.render_pdb(body)),
    ]
    children += [(NETWORKPOLICIES, p) for p in worker_network_policies(body, pipeline, ctx.config)]
    children += await _spark_connect(ctx, body, pipeline)
    if await ctx.serves(SERVICEMONITORS):
        sm_labels = {**ctx.config.service_monitor_labels, **extras.service_monitor_labels}
        children.append((SERVICEMONITORS, render.render_service_monitor(body, sm_labels)))
    found = await claim_all(ctx, [(CONFIGMAPS, configmap), *children], trusted)
    # The ConfigMap first: pods of a Deployment rolled to a new checksum must find the new
    # config when they start. The rest are independent of each other: in parallel.
    await ensure_child(ctx, CONFIGMAPS, configmap, found[0])
    results = await asyncio.gather(
        *(
            settled(ensure_child(ctx, res, obj, actual))
            for (res, obj), actual in zip(children, found[1:], strict=True)
        )
    )
    for result in results:
        if isinstance(result, Exception):
            raise result
    deployment = results[0]
    assert isinstance(deployment, Applied)
    return deployment


async def _spark_connect(
    ctx: OperatorContext, body: Mapping[str, Any], pipeline: PipelineSpec
) -> list[tuple[Resource, JSON]]:
    """The pipeline's SparkConnect and its NetworkPolicies when ``sink.spark.submit.mode`` is
    kubernetes (the token Secret applied first: the server and the workers read it at start);
    otherwise remove what it owned for one (the mode changed)."""
    name, namespace = render.meta(body)
    uid = body["metadata"]["uid"]
    if render.uses_spark_connect(pipeline):
        if not await ctx.serves(SPARKCONNECTS):
            raise ChildRejectedError(
                "sink.spark.submit.mode kubernetes needs the Kubeflow Spark operator: the API "
                "server does not serve sparkconnects.sparkoperator.k8s.io/v1alpha1"
            )
        token = await _connect_token(ctx, namespace, name, uid)
        await ensure_child(ctx, SECRETS, render.render_spark_connect_token(body, token))
        return [
            (SPARKCONNECTS, render.render_spark_connect(body, pipeline)),
            *((NETWORKPOLICIES, p) for p in render.render_spark_network_policies(body)),
        ]
    # Its policies and token go with the SparkConnect (looked for only then: every other
    # pipeline would pay three GETs a pass for them).
    if await ctx.serves(SPARKCONNECTS) and await remove_owned(
        ctx.api, SPARKCONNECTS, namespace, spark_k8s.spark_connect_name(name), uid
    ):
        for policy in render.render_spark_network_policies(body):
            name_ = policy["metadata"]["name"]
            await remove_owned(ctx.api, NETWORKPOLICIES, namespace, name_, uid)
        await remove_owned(ctx.api, SECRETS, namespace, spark_k8s.token_secret_name(name), uid)
    return []


async def _connect_token(ctx: OperatorContext, namespace: str, name: str, uid: str) -> str:
    """The token the pipeline's Secret holds (so a pass never changes it under the running
    server), or a new random one. A Secret of that name this pipeline does not own is left
    alone: ensure() then refuses it, naming it."""
    existing = await ctx.api.get(SECRETS, namespace, spark_k8s.token_secret_name(name))
    return render.owned_token(existing, uid) or secrets.token_urlsafe(32)


async def _apply_autoscaler(
    ctx: OperatorContext,
    body: Mapping[str, Any],
    pipeline: PipelineSpec,
    extras: OperatorSpec,
    old_status: Mapping[str, Any],
    secret: KafkaSecret | None,
) -> str | None:
    """Ensure the HPA or ScaledObject if autoscaling is on; remove ours if it is off. A
    ScaledObject on a pipeline with a Kafka Secret gets a TriggerAuthentication from it.

    Returns the kind in use (recorded in status.autoscaler, so that turning autoscaling off
    later knows there is something to remove without probing on every pass).
    """
    name, namespace = render.meta(body)
    uid = body["metadata"]["uid"]
    choice = render.wanted_autoscaler(
        body,
        pipeline,
        extras.autoscaling,
        old_status.get("partitions"),
        keda_served=await ctx.serves(SCALEDOBJECTS),
        kafka_mounts=None if secret is None else secret.mounts,
    )
    wanted: tuple[Resource, JSON] | None = None
    auth: JSON | None = None
    if choice is not None:
        autoscaler, auth = choice
        wanted = (SCALEDOBJECTS if autoscaler["kind"] == SCALEDOBJECTS.kind else HPAS, autoscaler)
    previous = old_status.get("autoscaler")
    for res in (HPAS, SCALEDOBJECTS):
        if previous == res.kind and (wanted is None or wanted[0] is not res):
            await remove_owned(ctx.api, res, namespace, names.autoscaler_name(name), uid)
    if previous == SCALEDOBJECTS.kind and auth is None:
        await remove_owned(ctx.api, TRIGGERAUTHS, namespace, names.autoscaler_name(name), uid)
    if wanted is None:
        return None
    if auth is not None:  # before the ScaledObject that refers to it
        await ensure_child(ctx, TRIGGERAUTHS, auth)
    await ensure_child(ctx, *wanted)
    return wanted[0].kind


async def _apply_slo_rule(
    ctx: OperatorContext,
    body: Mapping[str, Any],
    extras: OperatorSpec,
    old_status: Mapping[str, Any],
) -> str | None:
    """The pipeline's PrometheusRule while spec.slo is set and the cluster serves the kind;
    removed when spec.slo goes. Returns its name (status.sloRule, so that removing spec.slo
    later knows there is one to delete without probing on every pass)."""
    _, namespace = render.meta(body)
    if extras.slo is not None and await ctx.serves(PROMETHEUSRULES):
        labels = {**ctx.config.service_monitor_labels, **extras.service_monitor_labels}
        rule = render.render_prometheus_rule(body, extras.slo, labels)
        await ensure_child(ctx, PROMETHEUSRULES, rule)
        return str(rule["metadata"]["name"])
    previous = old_status.get("sloRule")
    if previous:
        await remove_owned(ctx.api, PROMETHEUSRULES, namespace, previous, body["metadata"]["uid"])
    return None


async def _own_deployment(ctx: OperatorContext, body: Mapping[str, Any]) -> JSON | None:
    """The pipeline's Deployment as it is, for status when this pass wrote none; None if the
    name is held by someone else's (its pods are not this pipeline's workers)."""
    name, namespace = render.meta(body)
    found = await ctx.api.get(DEPLOYMENTS, namespace, names.deployment_name(name))
    if found is None or not carries_uid(found, body["metadata"]["uid"]):
        return None
    return found


def _namespace_terminating(
    namespace: str, name: str, exc: NamespaceTerminatingError
) -> ReconcileResult:
    """The namespace is being deleted, the pipeline with it: nothing to do, and no error."""
    log.info("%s/%s: namespace is being deleted, pass ends: %s", namespace, name, exc)
    return ReconcileResult(gone=True)


def _failed_reason(exc: Exception) -> str:
    """The condition's reason for a child that could not be applied."""
    return NAME_TAKEN if isinstance(exc, NotOursError) else "ChildRejected"


async def _invalid(
    ctx: OperatorContext,
    body: Mapping[str, Any],
    old_status: Mapping[str, Any],
    outcome: ReconcileResult,
    why: str,
) -> ReconcileResult:
    """A pass that leaves the children alone (an invalid spec or Kafka Secret): only status,
    from the Deployment as it is."""
    name, _ = render.meta(body)
    current = await _own_deployment(ctx, body)
    running = int(((current or {}).get("spec") or {}).get("replicas") or 0)
    generation = body["metadata"].get("generation")
    seen = Observed(name, generation, running, deployment=current, invalid=why)
    return await _finish(ctx, body, old_status, seen, outcome)


async def _apply_beside_workers(
    ctx: OperatorContext,
    body: Mapping[str, Any],
    pipeline: PipelineSpec,
    extras: OperatorSpec,
    secret: KafkaSecret | None,
    old_status: Mapping[str, Any],
    outcome: ReconcileResult,
) -> None:
    """The children beside the workers' own: the autoscaler, the SLO rule, a redrive's Job."""
    outcome.status["autoscaler"] = await _apply_autoscaler(
        ctx, body, pipeline, extras, old_status, secret
    )
    outcome.status["sloRule"] = await _apply_slo_rule(ctx, body, extras, old_status)
    if extras.redrive is not None and redrive.pending(extras.redrive, old_status):
        # Independent of the workers (they keep running and consume what it replays);
        # the Job's watch and the resync bring the next step.
        replay = await redrive.advance(ctx, body, pipeline, extras.redrive, secret, old_status)
        outcome.status["redrive"] = replay.status
        outcome.events += replay.events


async def reconcile(ctx: OperatorContext, namespace: str, name: str) -> ReconcileResult:
    """One full pass for the named pipeline; the caller serialises passes per pipeline."""
    body = await ctx.api.get(PIPELINES, namespace, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return ReconcileResult(gone=True)  # deleted: the garbage collector removes the children
    outcome = ReconcileResult()
    old_status: Mapping[str, Any] = body.get("status") or {}
    generation = body["metadata"].get("generation")

    try:
        pipeline, extras = validated(ctx, body)
    except ConfigError as exc:
        # Leave the children alone: the workers keep running the last good spec.
        return await _invalid(ctx, body, old_status, outcome, str(exc))

    try:
        secret = await read_kafka_secret(ctx.api, namespace, pipeline)
    except KafkaSecretError as exc:
        # Like an invalid spec: the workers keep what they have until the Secret is usable.
        return await _invalid(ctx, body, old_status, outcome, str(exc))

    # The watched children from the watch's copies, except every CHILDREN_REREAD_SECONDS.
    trusted = ctx.state(namespace, name).children_trusted(time.monotonic())
    if pipeline.mode == "inject":
        return await _reconcile_injected(ctx, body, pipeline, secret, old_status, outcome, trusted)

    rewinding = rewind.pending(extras.rewind, old_status)
    replicas = render.desired_worker_replicas(pipeline, rewinding=rewinding)
    failed = None
    failed_reason = ""
    before: JSON | None = None
    deployment: JSON | None = None
    progress = None
    try:
        applied = await _apply_children(ctx, body, pipeline, extras, secret, replicas, trusted)
        before, deployment = applied.before, applied.obj
        if extras.rewind is not None and rewinding:
            step = await rewind.advance(
                ctx, namespace, pipeline, extras.rewind, deployment, old_status
            )
            outcome.status["rewind"] = step.status
            outcome.events += step.events
            rewinding, progress = step.waiting, step.message
            if rewinding:
                outcome.retry_after = ctx.config.rewind_poll_seconds
                outcome.message = progress
            else:  # done: the workers come back in this same pass
                replicas = render.desired_worker_replicas(pipeline, rewinding=False)
                applied = await _apply_children(
                    ctx, body, pipeline, extras, secret, replicas, trusted
                )
                deployment = applied.obj
        await _apply_beside_workers(ctx, body, pipeline, extras, secret, old_status, outcome)
    except NamespaceTerminatingError as exc:
        return _namespace_terminating(namespace, name, exc)
    except (ChildRejectedError, NotOursError) as exc:
        failed = str(exc)
        failed_reason = _failed_reason(exc)
        deployment = await _own_deployment(ctx, body)
    old_replicas = ((before or {}).get("spec") or {}).get("replicas")
    if before is not None and old_replicas != replicas and failed is None:
        why = render.scaling_reason(outcome.status.get("autoscaler"), extras, old_status)
        outcome.events.append(
            Event("Normal", "Scaled", f"workers: {old_replicas} -> {replicas}{why}")
        )
    seen = Observed(
        name,
        generation,
        replicas,
        paused=pipeline.paused,
        deployment=deployment,
        failed=failed,
        failed_reason=failed_reason,
        rewinding=progress if rewinding else None,
    )
    return await _finish(ctx, body, old_status, seen, outcome)


async def _reconcile_injected(
    ctx: OperatorContext,
    body: Mapping[str, Any],
    pipeline: PipelineSpec,
    secret: KafkaSecret | None,
    old_status: Mapping[str, Any],
    outcome: ReconcileResult,
    trusted: bool,
) -> ReconcileResult:
    """``spec.mode: inject``: the workers live in the user's pods (see :mod:`.inject`). The
    operator keeps their ConfigMap and metrics Service, removes a Deployment, PDB or autoscaler
    left from ``mode: deployment``, and reports the annotated pods."""
    name, namespace = render.meta(body)
    uid = body["metadata"]["uid"]
    derived = None if secret is None else secret.plain
    failed = None
    failed_reason = ""
    try:
        children = [
            (CONFIGMAPS, render.render_configmap(body, derived)),
            (SERVICES, render.render_service(body, pipeline)),
        ]
        found = await claim_all(ctx, children, trusted)
        for (res, obj), actual in zip(children, found, strict=True):
            await ensure_child(ctx, res, obj, actual)
    except NamespaceTerminatingError as exc:
        return _namespace_terminating(namespace, name, exc)
    except (ChildRejectedError, NotOursError) as exc:
        failed = str(exc)
        failed_reason = _failed_reason(exc)
    await remove_owned(ctx.api, DEPLOYMENTS, namespace, names.deployment_name(name), uid)
    await remove_owned(ctx.api, PDBS, namespace, names.pdb_name(name), uid)
    # Its pods are the user's: a policy selecting them would close the application's ports.
    await remove_owned(ctx.api, NETWORKPOLICIES, namespace, policy_name(name), uid)
    previous = old_status.get("autoscaler")
    for res in (HPAS, SCALEDOBJECTS, TRIGGERAUTHS):
        if previous in (res.kind, SCALEDOBJECTS.kind):
            await remove_owned(ctx.api, res, namespace, names.autoscaler_name(name), uid)
    outcome.status["autoscaler"] = None
    pods = await ctx.api.list(PODS, namespace, label_selector=names.injected_selector_string(name))
    partitions = render.replica_cap(pipeline, old_status.get("partitions"))
    seen = Observed(
        name,
        body["metadata"].get("generation"),
        0,
        failed=failed,
        failed_reason=failed_reason,
        pods=pods,
        checksum=render.checksum(render.pipeline_yaml(body, derived)),
        partitions=int(partitions) if partitions is not None else None,
    )
    return await _finish(ctx, body, old_status, seen, outcome)


async def _finish(
    ctx: OperatorContext,
    body: Mapping[str, Any],
    old_status: Mapping[str, Any],
    seen: Observed,
    outcome: ReconcileResult,
) -> ReconcileResult:
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


async def refresh_lag(ctx: OperatorContext, body: Mapping[str, Any]) -> bool:
    """Measure lag and write it to status. Returns whether the partition count changed.

    ``body``: the pipeline as kopf last saw it (no read of its own: a thousand pipelines would
    read their objects dozens of times a second just for this)."""
    name, namespace = render.meta(body)
    try:
        pipeline, _ = validated(ctx, body)
    except ConfigError:
        return False  # the reconcile reports it
    state = ctx.state(namespace, name)
    old: Mapping[str, Any] = body.get("status") or {}
    overridden: tuple[str, ...] = ()
    try:
        properties = await kafka_properties(ctx.api, namespace, pipeline)
        _, overridden = admin_config_overriding(
            pipeline, properties, ctx.config.kafka_timeout_seconds
        )
        report = await ctx.kafka.lag(pipeline, properties)
    except KafkaAccessError as exc:
        if state.lag_error != str(exc):
            log.warning("pipeline %s/%s: cannot measure lag: %s", namespace, name, exc)
            state.lag_error = str(exc)
        clients = operator_clients(str(exc), overridden)
        if changed(old, {"operatorClients": clients}):
            async with ctx.api_slots:
                await ctx.api.patch(
                    PIPELINES,
                    namespace,
                    name,
                    {"status": {"operatorClients": clients}},
                    subresource="status",
                )
        return False
    state.lag_error = None
    new: dict[str, Any] = {
        "lag": report.lag,
        "lagSeconds": report.lag_seconds,
        "partitions": report.partitions,
    }
    new["operatorClients"] = operator_clients(None, overridden)
    if pipeline.source.is_share_group:  # queue mode: the backlog the workers estimate
        inject = pipeline.mode == "inject"
        new["backlog"] = await queue_backlog(ctx, namespace, name, pipeline.metrics.port, inject)
    if lag_changed(old, new):
        async with ctx.api_slots:
            await ctx.api.patch(PIPELINES, namespace, name, {"status": new}, subresource="status")
    return bool(old.get("partitions") != report.partitions)


async def queue_backlog(
    ctx: OperatorContext, namespace: str, name: str, port: int, inject: bool
) -> int | None:
    """status.backlog of a queue-mode pipeline: the records past its share group's acquisition
    frontier, as its workers estimate them (share_backlog); None when no worker reports one.
    ``inject``: the workers run in the workload's pods (mode: inject)."""
    selector = names.injected_selector_string(name) if inject else names.selector_string(name)
    try:
        pods = await ctx.api.list(PODS, namespace, label_selector=selector)
    except ApiError as exc:  # the lag above is written all the same
        log.warning(
            "pipeline %s/%s: cannot list its workers for the backlog: %s", namespace, name, exc
        )
        return None
    backlog = await share_backlog.read_backlog(pods, port)
    return None if backlog is None else sum(backlog.values())


async def report_orphaned_pods(ctx: OperatorContext, namespace: str, name: str) -> int:
    """A deleted pipeline whose worker is still injected in pods: a Warning Event on each pod
    (its worker lost its ConfigMap; new pods of the workload are now refused by the webhook).
    Returns how many pods were reported."""
    pods = await ctx.api.list(PODS, namespace, label_selector=names.injected_selector_string(name))
    orphans = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    for pod in orphans:
        event = Event(
            "Warning",
            "PipelineDeleted",
            f"ConsumerPipeline {name} was deleted but this pod still carries its injected "
            f"worker: remove the {names.INJECT_ANNOTATION} annotation from the workload (new "
            f"pods are refused while it names a missing pipeline) or recreate the pipeline",
        )
        ctx.recent_events.append(((namespace, name), event))
        post_event(pod, event)
    if orphans:
        log.warning(
            "pipeline %s/%s deleted while %d pods still carry its worker",
            namespace,
            name,
            len(orphans),
        )
    return len(orphans)
