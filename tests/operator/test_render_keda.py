"""KEDA's ScaledObject (render.keda)."""

from __future__ import annotations

from operator_testkit import pipeline_body
from render_testkit import parsed

from offtake_operator import render
from offtake_operator.operator_spec import parse_operator_spec


def test_lag_seconds_with_keda_use_its_prometheus_scaler() -> None:
    body = pipeline_body(source={"topics": ["orders"], "groupId": "g1"})
    scaling = parse_operator_spec(
        {
            "autoscaling": {
                "enabled": True,
                "minReplicas": 0,
                "targetLagSeconds": 20,
                "prometheusAddress": "http://prometheus.monitoring:9090",
            }
        }
    ).autoscaling
    assert render.uses_scaled_object(scaling, keda_served=True)
    so = render.render_scaled_object(body, parsed(body), scaling, 6)
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (0, 6)
    assert so["spec"]["cooldownPeriod"] == 300
    assert so["spec"]["advanced"] == {
        "horizontalPodAutoscalerConfig": {
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}}
        }
    }
    (trigger,) = so["spec"]["triggers"]
    assert trigger == {
        "type": "prometheus",
        "metricType": "Value",
        "metadata": {
            "serverAddress": "http://prometheus.monitoring:9090",
            "query": 'max(offtake_consumer_lag_seconds{namespace="shop", pipeline="orders"})',
            "threshold": "20",
            "ignoreNullValues": "true",
        },
    }
