"""The ServiceMonitor that has the Prometheus operator scrape a pipeline's workers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import names
from .metadata import JSON, child_metadata, meta


def render_service_monitor(
    body: Mapping[str, Any], extra_labels: Mapping[str, str] | None = None
) -> JSON:
    """``extra_labels`` (the chart's and the pipeline's) let a Prometheus that selects
    ServiceMonitors by label (kube-prometheus-stack: ``release``) find it; ours win."""
    name, _ = meta(body)
    metadata = child_metadata(body, name, "metrics")
    metadata["labels"] = {**(extra_labels or {}), **metadata["labels"]}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": metadata,
        "spec": {
            "selector": {
                "matchLabels": {names.PIPELINE_LABEL: name, names.COMPONENT_LABEL: "metrics"}
            },
            "endpoints": [
                {
                    "port": names.METRICS_PORT_NAME,
                    "path": "/metrics",
                    "interval": "15s",
                    # The labels docs/metrics.md promises the dashboards and alert rules:
                    # job="offtake" and pipeline=<name> (namespace and pod come by default).
                    "relabelings": [
                        {"action": "replace", "targetLabel": "job", "replacement": "offtake"},
                        {
                            "action": "replace",
                            "sourceLabels": ["__meta_kubernetes_pod_label_offtake_dev_pipeline"],
                            "targetLabel": "pipeline",
                        },
                    ],
                }
            ],
        },
    }
