"""The headless metrics Service of a pipeline's workers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from offtake.contract import PipelineSpec

from .. import names
from .metadata import JSON, child_metadata, meta


def render_service(body: Mapping[str, Any], pipeline: PipelineSpec) -> JSON:
    """A headless Service: Prometheus (and the ServiceMonitor) scrape every worker by pod IP."""
    name, _ = meta(body)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(body, names.service_name(name), "metrics"),
        "spec": {
            "clusterIP": "None",
            "selector": names.selector(name),
            "ports": [
                {
                    "name": names.METRICS_PORT_NAME,
                    "port": pipeline.metrics.port,
                    "targetPort": names.METRICS_PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }
