"""What the HPA and KEDA's ScaledObject share: the replica bounds, the scale target, the
scale-down behaviour and the lag query."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from offtake.contract import (
    LAG_SECONDS_METRIC,
    PipelineSpec,
)

from ..names import API_VERSION, KIND
from ..operator_spec import Autoscaling
from .metadata import JSON, meta


def replica_cap(pipeline: PipelineSpec, partitions: int | None) -> int | None:
    """The most workers that get work: the partition count in a consumer group; no cap in a
    share group (source.groupType share), whose members share every partition's records."""
    return None if pipeline.source.is_share_group else partitions


def replica_bounds(autoscaling: Autoscaling, partitions: int | None) -> tuple[int, int]:
    """(min, max) replicas, never above the partition count: an extra consumer would idle."""
    top = autoscaling.max_replicas
    if partitions:
        top = min(top, partitions)
    return min(autoscaling.min_replicas, top), top


def scale_target(body: Mapping[str, Any]) -> JSON:
    return {"apiVersion": API_VERSION, "kind": KIND, "name": body["metadata"]["name"]}


def behavior(autoscaling: Autoscaling) -> JSON:
    # Each scale step rebalances the group; damp scale-down so a drained backlog does not flap.
    return {
        "scaleDown": {"stabilizationWindowSeconds": autoscaling.scale_down_stabilization_seconds}
    }


def lag_seconds_query(body: Mapping[str, Any]) -> str:
    """PromQL for the pipeline's lag in seconds: its worst partition, over all workers."""
    name, namespace = meta(body)
    return f'max({LAG_SECONDS_METRIC}{{namespace="{namespace}", pipeline="{name}"}})'
