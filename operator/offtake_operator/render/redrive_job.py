"""The Job that runs ``offtake redrive`` once for a redrive request."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from offtake.contract import (
    PipelineSpec,
    RedriveRequest,
)

from .. import names
from ..settings import OperatorConfig
from .metadata import JSON, child_metadata, meta
from .pod import copy_pod_settings, pod_volumes, security_contexts, worker_container


def render_redrive_job(
    body: Mapping[str, Any],
    pipeline: PipelineSpec,
    config: OperatorConfig,
    request: RedriveRequest,
    group: str,
    *,
    kafka_mounts: Sequence[tuple[str, Mapping[str, str]]] | None = None,
) -> JSON:
    """The Job that runs ``offtake redrive`` once for ``request``: the worker's image, config
    (the same ConfigMap), Kafka credentials, pod settings and restricted security contexts.

    Its pods do not carry the pipeline label: they are not workers (the Deployment, the metrics
    Service and the PodDisruptionBudget select by it).
    """
    name, _ = meta(body)
    spec = body["spec"]
    template = spec.get("template") or {}
    template_spec = template.get("spec") or {}
    worker = worker_container(body, pipeline, config)
    container = _redrive_container(worker, request, group)
    pod_labels = {
        **((template.get("metadata") or {}).get("labels") or {}),
        "app.kubernetes.io/name": "offtake",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "redrive",
        names.COMPONENT_LABEL: "redrive",
        names.REDRIVE_LABEL: name,
    }
    pod_labels.pop(names.PIPELINE_LABEL, None)
    pod_spec: JSON = {
        "containers": [container],
        "volumes": pod_volumes(name, pipeline, kafka_mounts),
        # A failed attempt's pod stays for its logs; the Job starts another (which resumes).
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        # `offtake redrive` talks to Kafka only, never to the Kubernetes API.
        "automountServiceAccountToken": False,
        "securityContext": security_contexts(body)[0],
    }
    copy_pod_settings(template_spec, pod_spec)
    metadata = child_metadata(body, names.redrive_job_name(name), "redrive")
    metadata["annotations"] = {names.REDRIVE_ID_ANNOTATION: request.id}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": 4,
            "ttlSecondsAfterFinished": names.REDRIVE_JOB_TTL_SECONDS,
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    "annotations": {names.REDRIVE_ID_ANNOTATION: request.id},
                },
                "spec": pod_spec,
            },
        },
    }


def _redrive_container(worker: JSON, request: RedriveRequest, group: str) -> JSON:
    """``offtake redrive`` in the worker container's image, environment, mounts and context."""
    container: JSON = {
        "name": names.REDRIVE_CONTAINER,
        "image": worker["image"],
        "command": ["offtake"],
        "args": [
            "redrive",
            "--pipeline",
            names.PIPELINE_PATH,
            "--id",
            request.id,
            "--from",
            request.source,
            "--until",
            request.until_text,
            "--group",
            group,
        ],
        "env": worker["env"],
        "volumeMounts": worker["volumeMounts"],
        "securityContext": worker["securityContext"],
        # The summary line (replayed, left, skipped) shows in `kubectl describe pod`.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    for key in ("imagePullPolicy", "resources"):
        if key in worker:
            container[key] = worker[key]
    return container
