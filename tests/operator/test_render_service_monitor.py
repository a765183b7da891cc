"""The ServiceMonitor (render.service_monitor)."""

from __future__ import annotations

from operator_testkit import pipeline_body
from render_testkit import parsed

from offtake_operator import render


def test_service_monitor_labels_series_as_the_dashboards_expect() -> None:
    sm = render.render_service_monitor(pipeline_body())
    assert sm["spec"]["selector"]["matchLabels"] == {
        "offtake.dev/pipeline": "orders",
        "offtake.dev/component": "metrics",
    }
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
    assert relabel["job"]["replacement"] == "offtake"
    assert relabel["pipeline"]["sourceLabels"] == [
        "__meta_kubernetes_pod_label_offtake_dev_pipeline"
    ]
    svc = render.render_service(pipeline_body(), parsed(pipeline_body()))
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
