"""The NetworkPolicy of a pipeline's worker pods: ingress to the metrics port only.

A worker takes no connection but scrapes and the kubelet's probes: Kafka, the sink and the
schema registry are outbound, a processor container is on localhost. Any pod of the cluster
could otherwise reach both of its listeners, fill the metrics port's connection slots, or
try the probe port. The policy admits the metrics port from the peers the admin names in the
chart (``networkPolicy.metricsFrom``, e.g. Prometheus's namespace; none named: any peer) and
nothing else. The probe port (:mod:`.worker_probes`) gets no rule: the kubelet reaches a pod
from its node, which the CNIs that enforce NetworkPolicies admit regardless of them.

The operator renders it with the Deployment, for every namespace it serves: a cluster-wide
install (no ``operator.namespaces``) does not know its namespaces in advance, so the chart
cannot. Only the Deployment's pods are selected (``component: worker``, managed by the
operator): an injected worker (``spec.mode: inject``) lives in the user's pod, whose other
ports a policy selecting it would close.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from offtake.contract import PipelineSpec

from .. import names
from ..settings import OperatorConfig
from .metadata import child_metadata

JSON = dict[str, Any]


def policy_name(pipeline: str) -> str:
    return f"{pipeline}-workers"


def pod_selector(pipeline: str) -> dict[str, str]:
    """The Deployment's worker pods of ``pipeline`` (render.labels(pipeline, "worker"))."""
    return {
        names.PIPELINE_LABEL: pipeline,
        names.COMPONENT_LABEL: "worker",
        "app.kubernetes.io/managed-by": names.MANAGED_BY,
    }


def render_worker_network_policy(
    body: Mapping[str, Any], pipeline: PipelineSpec, config: OperatorConfig
) -> JSON:
    """The policy, owned by the pipeline."""
    rule: JSON = {"ports": [{"protocol": "TCP", "port": pipeline.metrics.port}]}
    if config.worker_metrics_from:
        rule["from"] = [copy.deepcopy(peer) for peer in config.worker_metrics_from]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(body, policy_name(pipeline.name), "worker"),
        "spec": {
            "podSelector": {"matchLabels": pod_selector(pipeline.name)},
            "policyTypes": ["Ingress"],
            "ingress": [rule],
        },
    }


def worker_network_policies(
    body: Mapping[str, Any], pipeline: PipelineSpec, config: OperatorConfig
) -> list[JSON]:
    """What the reconcile pass applies with the Deployment: the policy, or none when the
    chart turned NetworkPolicies off."""
    if not config.worker_network_policy:
        return []
    return [render_worker_network_policy(body, pipeline, config)]
