"""``spec.mode: inject``: the worker as a native sidecar of the user's own pods.

Pure functions, like :mod:`.render`: from an annotated pod and its pipeline to the pod the
admission webhook (:mod:`.webhook`) answers with. The injected worker is the container the
operator's own Deployment would run (same image, command, env, probes, restricted security
context, pipeline ConfigMap and Kafka Secret volumes), as an init container with
``restartPolicy: Always``. Its processor is the pod's application container, reached on
localhost at ``spec.processor.container.port`` through the sidecar protocol.

Stopping order: Kubernetes stops a pod's main containers before its native sidecars, which is
the wrong way round for a worker that must deliver its last records to the application. So
the application container gets a preStop hook that asks the worker to drain (``GET /drain``
on the worker's metrics port): the worker stops consuming, delivers what is in flight,
commits, leaves the group and answers; only then does the application get its SIGTERM.

Who may drain: the hook is an ``httpGet`` because it must work in any application image (a
distroless one has no shell or client to ``exec``), and the kubelet sends it from the node.
The worker serves ``/drain`` only to loopback (the pod's own containers, ``offtake drain``)
and to its node's addresses (``status.hostIPs`` through the downward API, and the pod's
gateway), so no other pod can stop it; there is no token, which would sit in the pod spec.
The worker does not call the Kubernetes API, so the pod's service account token is not
mounted into it: an empty directory takes its place (the application's own containers keep
what the pod says).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from offtake.contract import PipelineSpec

from . import names, render
from .errors import OperatorError
from .security import DEFAULT_UID
from .settings import OperatorConfig

JSON = dict[str, Any]

DRAIN_ENV = "OFFTAKE_DRAIN"  # offtake.health.DRAIN_ENV
NODE_IPS_ENV = "OFFTAKE_NODE_IPS"  # offtake.health.NODE_IPS_ENV
#: Where the API server mounts a pod's service account token into each container.
API_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
NO_API_TOKEN_VOLUME = "no-api-token"


class InjectionError(OperatorError):
    """The pod cannot get the worker; the message says why (the webhook's rejection)."""


def annotated_pipeline(pod: Mapping[str, Any]) -> str | None:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(names.INJECT_ANNOTATION)
    return str(value) if value else None


def already_injected(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    return any(
        c.get("name") == names.INJECTED_CONTAINER
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])
    )


def app_container_index(pod: Mapping[str, Any]) -> int:
    containers = (pod.get("spec") or {}).get("containers") or []
    wanted = ((pod.get("metadata") or {}).get("annotations") or {}).get(
        names.APP_CONTAINER_ANNOTATION
    )
    if not wanted:
        return 0
    for i, c in enumerate(containers):
        if c.get("name") == wanted:
            return i
    raise InjectionError(
        f"annotation {names.APP_CONTAINER_ANNOTATION}={wanted!r} names no container of the pod "
        f"(it has {', '.join(repr(c.get('name')) for c in containers) or 'none'})"
    )


def _prefixed(name: str) -> str:
    return names.INJECTED_VOLUME_PREFIX + name


def _check_ports_free(spec: Mapping[str, Any], pipeline: PipelineSpec, name: str) -> None:
    """Refuse a pod whose containers already use the worker's metrics or probe port."""
    containers = (spec.get("containers") or []) + (spec.get("initContainers") or [])
    taken = {int(p.get("containerPort", 0)) for c in containers for p in c.get("ports") or []}
    for used, field in (
        (pipeline.metrics.port, "port"),
        (pipeline.metrics.probe_port, "probePort"),
    ):
        if used in taken:
            raise InjectionError(
                f"the pod already uses port {used}, the worker's metrics {field}: set "
                f"spec.metrics.{field} of pipeline {name} to a free one"
            )


def _injected_worker(
    body: Mapping[str, Any], pipeline: PipelineSpec, config: OperatorConfig
) -> JSON:
    """The Deployment's worker container as a native sidecar of the user's pod."""
    worker = render.worker_container(body, pipeline, config)
    worker["name"] = names.INJECTED_CONTAINER
    worker["restartPolicy"] = "Always"
    # The pod's securityContext is the user's: the restricted settings go on the container.
    worker["securityContext"] = {
        **worker["securityContext"],
        "runAsUser": DEFAULT_UID,
        "runAsGroup": DEFAULT_UID,
    }
    for mount in worker["volumeMounts"]:
        mount["name"] = _prefixed(mount["name"])
    worker["env"] += [
        {"name": DRAIN_ENV, "value": "true"},
        # Where the kubelet's preStop httpGet comes from: the worker admits /drain from there.
        {"name": NODE_IPS_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
    ]
    return worker


def injected_pod(
    pod: Mapping[str, Any],
    body: Mapping[str, Any],
    pipeline: PipelineSpec,
    config: OperatorConfig,
    *,
    kafka_mounts: Sequence[tuple[str, Mapping[str, str]]] | None = None,
    kafka_config: Mapping[str, str] | None = None,
) -> tuple[JSON, list[str]]:
    """The pod with the worker injected (a new dict; ``pod`` is not changed), and warnings
    for the user (the API server shows them to kubectl)."""
    warnings: list[str] = []
    name, _ = render.meta(body)
    out: JSON = copy.deepcopy(dict(pod))
    spec: JSON = out.setdefault("spec", {})
    containers: list[JSON] = spec.get("containers") or []
    if not containers:
        raise InjectionError("the pod has no containers")
    app = containers[app_container_index(pod)]

    port = pipeline.metrics.port
    _check_ports_free(spec, pipeline, name)
    worker = _injected_worker(body, pipeline, config)

    volumes = render.pod_volumes(name, pipeline, kafka_mounts)
    for volume in volumes:
        volume["name"] = _prefixed(volume["name"])
    # The pod's service account token is the application's: an empty directory where the API
    # server would mount it into the worker (it skips a container that has a mount there).
    volumes.append({"name": _prefixed(NO_API_TOKEN_VOLUME), "emptyDir": {"sizeLimit": "1Mi"}})
    worker["volumeMounts"].append(
        {"name": _prefixed(NO_API_TOKEN_VOLUME), "mountPath": API_TOKEN_DIR, "readOnly": True}
    )
    existing = {v.get("name") for v in spec.get("volumes") or []}
    clash = sorted(existing & {v["name"] for v in volumes})
    if clash:
        raise InjectionError(f"the pod already has volumes named {', '.join(clash)}")
    spec["volumes"] = (spec.get("volumes") or []) + volumes
    # After the user's own init containers: they run to completion first, as they expect.
    spec["initContainers"] = (spec.get("initContainers") or []) + [worker]

    if (app.get("lifecycle") or {}).get("preStop") is not None:
        warnings.append(
            f"container {app.get('name')} has its own preStop hook: the injected worker of "
            f"pipeline {name} drains only when the kubelet stops it, after the application"
        )
    else:
        app.setdefault("lifecycle", {})["preStop"] = {"httpGet": {"path": "/drain", "port": port}}
    # Room for the drain, the final commit and leaving the group before the SIGKILL.
    grace = render.grace_period_seconds(pipeline)
    spec["terminationGracePeriodSeconds"] = max(
        int(spec.get("terminationGracePeriodSeconds") or 30), grace
    )

    meta: JSON = out.setdefault("metadata", {})
    meta.setdefault("labels", {}).update({names.PIPELINE_LABEL: name, names.INJECTED_LABEL: "true"})
    meta.setdefault("annotations", {})[names.INJECTED_ANNOTATION] = render.checksum(
        render.pipeline_yaml(body, kafka_config)
    )
    return out, warnings
