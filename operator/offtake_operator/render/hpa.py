"""The HorizontalPodAutoscaler on the pipeline's scale subresource."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from offtake.contract import (
    LAG_MESSAGES_METRIC,
    LAG_SECONDS_METRIC,
)

from .. import names, queue_autoscaling
from ..operator_spec import Autoscaling
from .metadata import JSON, child_metadata, meta
from .scaling import behavior, replica_bounds, scale_target


def _hpa_metric(body: Mapping[str, Any], autoscaling: Autoscaling) -> JSON:
    if autoscaling.on_backlog:  # queue mode: the share group's backlog
        return queue_autoscaling.hpa_metric(meta(body)[0], autoscaling)
    if autoscaling.target_lag_seconds is None:
        # Total lag divided by the messages one worker is expected to carry.
        return {
            "type": "Pods",
            "pods": {
                "metric": {"name": LAG_MESSAGES_METRIC},
                "target": {
                    "type": "AverageValue",
                    "averageValue": str(autoscaling.target_lag_per_replica),
                },
            },
        }
    # Lag in seconds does not divide among pods: a Value target makes the HPA scale the
    # current replica count by (lag / target), up while the backlog ages, down as it drains.
    name, _ = meta(body)
    return {
        "type": "External",
        "external": {
            "metric": {
                "name": LAG_SECONDS_METRIC,
                "selector": {"matchLabels": {"pipeline": name}},
            },
            "target": {"type": "Value", "value": str(autoscaling.target_lag_seconds)},
        },
    }


def render_hpa(body: Mapping[str, Any], autoscaling: Autoscaling, partitions: int | None) -> JSON:
    """An HPA on the pipeline's scale subresource, on the workers' lag.

    In messages: a Pods metric offtake_consumer_lag_messages (a custom-metrics adapter such as
    prometheus-adapter serves it summed per pod), target total lag / targetLagPerReplica.
    In seconds: an External metric offtake_consumer_lag_seconds{pipeline=...} (the adapter
    serves the pipeline's maximum in the pipeline's namespace), target Value targetLagSeconds.
    """
    name, _ = meta(body)
    low, high = replica_bounds(autoscaling, partitions)
    # An HPA cannot scale to zero (the HPAScaleToZero gate is alpha): minReplicas 0 means 1.
    low = max(low, 1)
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": child_metadata(body, names.autoscaler_name(name), "autoscaler"),
        "spec": {
            "scaleTargetRef": scale_target(body),
            "minReplicas": low,
            "maxReplicas": high,
            "metrics": [_hpa_metric(body, autoscaling)],
            "behavior": behavior(autoscaling),
        },
    }
