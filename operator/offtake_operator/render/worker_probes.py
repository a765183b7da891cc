"""The worker container's probe listener: its port entry and the argument that starts it.

The kubelet's probes go to ``spec.metrics.probePort``, a listener of the worker's own
(``offtake worker --probe-port``) that serves ``/healthz`` and ``/readyz`` only, never to the
metrics port: clients that hold the metrics port's connection slots would otherwise make every
probe fail and the kubelet restart a healthy worker (offtake.health, docs/security.md). The
worker's NetworkPolicy (:mod:`.worker_network_policy`) admits no pod to this port; the
kubelet reaches it from the node.
"""

from __future__ import annotations

from typing import Any

from offtake.contract import PipelineSpec

from .. import names


def probe_port(pipeline: PipelineSpec) -> dict[str, Any]:
    """The container port the readiness and liveness probes name."""
    return {
        "name": names.PROBE_PORT_NAME,
        "containerPort": pipeline.metrics.probe_port,
        "protocol": "TCP",
    }


def probe_args(pipeline: PipelineSpec) -> list[str]:
    """``offtake worker`` arguments that start the probe listener on that port."""
    return ["--probe-port", str(pipeline.metrics.probe_port)]
