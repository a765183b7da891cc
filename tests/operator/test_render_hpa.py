"""The HPA, and the replica bounds it shares with KEDA (render.hpa, render.scaling)."""

from __future__ import annotations

import pytest
from operator_testkit import pipeline_body
from render_testkit import parsed

from offtake_operator import render
from offtake_operator.operator_spec import parse_operator_spec


@pytest.mark.parametrize(("partitions", "expected"), [(None, (2, 10)), (6, (2, 6)), (1, (1, 1))])
def test_autoscalers_never_exceed_the_partition_count(
    partitions: int | None, expected: tuple[int, int]
) -> None:
    body = pipeline_body(source={"topics": ["orders"], "groupId": "g1"})
    scaling = parse_operator_spec(
        {"autoscaling": {"enabled": True, "minReplicas": 2, "targetLagPerReplica": 500}}
    ).autoscaling
    hpa = render.render_hpa(body, scaling, partitions)
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == expected
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "name": "orders",
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "offtake_consumer_lag_messages"
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "500"}
    so = render.render_scaled_object(body, parsed(body), scaling, partitions)
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == expected
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "kafka"
    assert trigger["metadata"] == {
        "bootstrapServers": "kafka:9092",
        "consumerGroup": "g1",
        "lagThreshold": "500",
        "offsetResetPolicy": "earliest",
        "topic": "orders",
    }


def test_lag_seconds_scale_an_hpa_on_the_external_metric_with_a_stabilised_scale_down() -> None:
    body = pipeline_body(source={"topics": ["orders"], "groupId": "g1"})
    scaling = parse_operator_spec(
        {
            "autoscaling": {
                "enabled": True,
                "maxReplicas": 8,
                "targetLagSeconds": 30,
                "scaleDownStabilizationSeconds": 45,
            }
        }
    ).autoscaling
    hpa = render.render_hpa(body, scaling, 4)
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
    assert hpa["spec"]["metrics"] == [
        {
            "type": "External",
            "external": {
                "metric": {
                    "name": "offtake_consumer_lag_seconds",
                    "selector": {"matchLabels": {"pipeline": "orders"}},
                },
                "target": {"type": "Value", "value": "30"},
            },
        }
    ]
    assert hpa["spec"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 45}}
    # Without a Prometheus address KEDA cannot ask for seconds: the HPA is the one rendered.
    assert not render.uses_scaled_object(scaling, keda_served=True)
    assert not render.uses_scaled_object(scaling, keda_served=False)
