"""The autoscaler a pipeline gets: KEDA's ScaledObject (with a TriggerAuthentication from its
Kafka Secret) or the HPA, or none; and how a scale step is told in the pipeline's events."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from offtake.contract import PipelineSpec

from ..operator_spec import Autoscaling, OperatorSpec
from .hpa import render_hpa
from .keda import render_scaled_object, render_trigger_authentication, uses_scaled_object
from .metadata import JSON
from .scaling import replica_cap


def wanted_autoscaler(
    body: Mapping[str, Any],
    pipeline: PipelineSpec,
    autoscaling: Autoscaling,
    partitions: int | None,
    *,
    keda_served: bool,
    kafka_mounts: Sequence[tuple[str, Mapping[str, str]]] | None,
) -> tuple[JSON, JSON | None] | None:
    """(the HPA or ScaledObject, the ScaledObject's TriggerAuthentication or None), or None
    when autoscaling is off. ``partitions``: the source's count last measured (status)."""
    # Paused: no autoscaler, or it would keep writing spec.replicas behind the user's back.
    if not autoscaling.enabled or pipeline.paused:
        return None
    cap = replica_cap(pipeline, partitions)
    if not uses_scaled_object(autoscaling, keda_served):
        return render_hpa(body, autoscaling, cap), None
    auth = None
    if kafka_mounts is not None and not autoscaling.asks_prometheus:
        auth = render_trigger_authentication(body, kafka_mounts)
    scaled = render_scaled_object(body, pipeline, autoscaling, cap, authenticated=auth is not None)
    return scaled, auth


def scaling_reason(
    autoscaler: str | None, extras: OperatorSpec, old_status: Mapping[str, Any]
) -> str:
    """Who changed spec.replicas and on what, for the Scaled event (kubectl describe cpl):
    the autoscaler's kind and its target against the lag last measured."""
    if autoscaler is None:
        return ""
    scaling = extras.autoscaling
    if scaling.target_lag_seconds is not None:
        seen = old_status.get("lagSeconds")
        measure = f"lag {seen} s" if seen is not None else "lag in seconds"
        target = f"target {scaling.target_lag_seconds} s"
    else:
        seen = old_status.get("lag")
        measure = f"lag {seen} messages" if seen is not None else "lag in messages"
        target = f"target {scaling.target_lag_per_replica} per worker"
    return f" (autoscaler: {autoscaler}; {measure}, {target})"
