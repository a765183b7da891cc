"""The workers' Deployment."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from offtake.contract import PipelineSpec

from .. import names
from ..settings import OperatorConfig
from .metadata import JSON, checksum, child_metadata, labels, meta
from .pod import (
    copy_pod_settings,
    grace_period_seconds,
    pod_volumes,
    processor_container,
    security_contexts,
    worker_container,
)
from .worker_config import pipeline_yaml


def desired_worker_replicas(pipeline: PipelineSpec, *, rewinding: bool) -> int:
    """Workers to run: none while paused or while a rewind needs the group empty."""
    if pipeline.paused or rewinding:
        return 0
    return int(pipeline.replicas)


def render_deployment(
    body: Mapping[str, Any],
    pipeline: PipelineSpec,
    config: OperatorConfig,
    *,
    replicas: int,
    kafka_mounts: Sequence[tuple[str, Mapping[str, str]]] | None = None,
    kafka_config: Mapping[str, str] | None = None,
) -> JSON:
    """The workers' Deployment. ``kafka_mounts`` lists the Kafka Secrets with their keys mapped
    to the property names the worker reads them as (None: spec.kafka.secretRef with every key
    as it is); ``kafka_config`` is what the ConfigMap got on top of the spec (see
    :func:`pipeline_document`)."""
    name, _ = meta(body)
    spec = body["spec"]
    template = spec.get("template") or {}
    template_meta = template.get("metadata") or {}
    template_spec = template.get("spec") or {}
    selector = names.selector(name)

    pod_labels = {**(template_meta.get("labels") or {}), **labels(name, "worker")}
    pod_annotations = {
        **(template_meta.get("annotations") or {}),
        names.CHECKSUM_ANNOTATION: checksum(pipeline_yaml(body, kafka_config)),
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(pipeline.metrics.port),
        "prometheus.io/path": "/metrics",
    }
    volumes = pod_volumes(name, pipeline, kafka_mounts)

    pod_spec: JSON = {
        "containers": [worker_container(body, pipeline, config)],
        "volumes": volumes,
        "terminationGracePeriodSeconds": grace_period_seconds(pipeline),
        # Service links add an env var per Service in the namespace: noise, and slow in big ones.
        "enableServiceLinks": False,
        # The worker never calls the Kubernetes API: no token for whoever takes over the pod.
        "automountServiceAccountToken": False,
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": selector},
            }
        ],
    }
    if pipeline.processor.container is not None:
        pod_spec["initContainers"] = [processor_container(body)]
        volumes.append({"name": "processor-tmp", "emptyDir": {}})
    pod_spec["securityContext"] = security_contexts(body)[0]
    copy_pod_settings(template_spec, pod_spec)

    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(body, names.deployment_name(name), "worker"),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            # Never below the ready count during a rollout: a new worker joins the group and
            # becomes ready before an old one leaves.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "revisionHistoryLimit": 5,
            "progressDeadlineSeconds": 600,
            "template": {
                "metadata": {"labels": pod_labels, "annotations": pod_annotations},
                "spec": pod_spec,
            },
        },
    }
