"""The parts of a worker pod: the worker and processor containers, their volumes, security
contexts and pod settings. Shared by the Deployment, the redrive Job and the admission webhook's
injected worker (:mod:`offtake_operator.inject`)."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

from offtake.contract import (
    ConfigError,
    PipelineSpec,
    secret_envs,
)
from offtake.contract import spark_kubernetes as spark_k8s

from .. import names, security
from ..security import CONTAINER_DEFAULTS, POD_DEFAULTS, merged
from ..settings import OperatorConfig
from .metadata import JSON
from .spark_connect import uses_spark_connect
from .worker_probes import probe_args, probe_port


def security_contexts(body: Mapping[str, Any]) -> tuple[JSON, JSON, JSON]:
    """(pod, worker container, processor container) securityContexts: the restricted defaults
    with the pipeline's overrides merged over them (checked by :mod:`.security`)."""
    spec = body.get("spec") or {}
    template_spec = (spec.get("template") or {}).get("spec") or {}
    processor = ((spec.get("processor") or {}).get("container") or {}).get("securityContext")
    return (
        merged(POD_DEFAULTS, template_spec.get("securityContext")),
        merged(CONTAINER_DEFAULTS, template_spec.get("containerSecurityContext")),
        merged(CONTAINER_DEFAULTS, processor),
    )


def grace_period_seconds(pipeline: PipelineSpec) -> int:
    # Above the drain budget: the worker needs time after draining to flush the producer,
    # commit and leave the group before the kubelet's SIGKILL.
    return math.ceil(float(pipeline.shutdown.drain_timeout_seconds)) + names.GRACE_EXTRA_SECONDS


def http_probe(path: str, port: str, **timing: int) -> JSON:
    return {"httpGet": {"path": path, "port": port}, **timing}


def worker_env(body: Mapping[str, Any], pipeline: PipelineSpec) -> list[JSON]:
    """The worker container's environment: the pod's own names, HOME, Spark Connect's URL and
    token, the ``*SecretRef`` variables, then spec.template.spec.env. A template variable of
    a name set above replaces it (a second entry of one name is refused by the API server's
    apply: the Deployment was never written, and the operator retried without end)."""
    template_spec = (body["spec"].get("template") or {}).get("spec") or {}
    env: list[JSON] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    # The root filesystem is read-only: whatever wants a home (Spark's ivy cache) gets /tmp.
    env.append({"name": "HOME", "value": "/tmp"})
    if uses_spark_connect(pipeline):
        # The pipeline's SparkConnect server (render_spark_connect), through its Service.
        env.append(
            {
                "name": spark_k8s.CONNECT_URL_ENV,
                "value": spark_k8s.kubernetes_connect_url(pipeline.name, pipeline.namespace),
            }
        )
        # Its token, from the Secret the operator generated: never a literal in the spec.
        env.append(
            {
                "name": spark_k8s.CONNECT_TOKEN_ENV,
                "valueFrom": {
                    "secretKeyRef": {
                        "name": spark_k8s.token_secret_name(pipeline.name),
                        "key": spark_k8s.TOKEN_KEY,
                    }
                },
            }
        )
    env += secret_key_env(pipeline)
    template_env = copy.deepcopy(template_spec.get("env") or [])
    overridden = {e.get("name") for e in template_env}
    return [e for e in env if e["name"] not in overridden] + template_env


def worker_mounts(pipeline: PipelineSpec) -> list[JSON]:
    """The worker container's volume mounts (the volumes are :func:`pod_volumes`)."""
    mounts: list[JSON] = [
        # subPath: a single file, so the Secret mounts below do not nest inside a read-only volume.
        {
            "name": "pipeline",
            "mountPath": names.PIPELINE_PATH,
            "subPath": names.CONFIG_KEY,
            "readOnly": True,
        },
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if pipeline.kafka.secret_ref is not None or pipeline.kafka.ca_secret_ref is not None:
        mounts.append(
            {"name": "kafka-secret", "mountPath": names.KAFKA_SECRET_DIR, "readOnly": True}
        )
    if jdbc_secret_name(pipeline) is not None:
        mounts.append({"name": "jdbc-secret", "mountPath": names.JDBC_SECRET_DIR, "readOnly": True})
    for i, secret in enumerate(schema_registry_secrets(pipeline)):
        mounts.append(
            {
                "name": f"schema-registry-secret-{i}",
                "mountPath": f"{names.SCHEMA_REGISTRY_SECRETS_DIR}/{secret}",
                "readOnly": True,
            }
        )
    return mounts


def worker_container(
    body: Mapping[str, Any], pipeline: PipelineSpec, config: OperatorConfig
) -> JSON:
    spec = body["spec"]
    container: JSON = {
        "name": names.WORKER_CONTAINER,
        "image": spec.get("image")
        or (config.worker_spark_image if pipeline.sink.spark is not None else config.worker_image),
        "command": ["offtake"],
        "args": ["worker", "--pipeline", names.PIPELINE_PATH, *probe_args(pipeline)],
        "env": worker_env(body, pipeline),
        "ports": [
            {
                "name": names.METRICS_PORT_NAME,
                "containerPort": pipeline.metrics.port,
                "protocol": "TCP",
            },
            probe_port(pipeline),
        ],
        # Not ready while starting, draining or stopped: the rollout waits for a real consumer.
        "readinessProbe": http_probe(
            "/readyz", names.PROBE_PORT_NAME, periodSeconds=5, failureThreshold=2
        ),
        "livenessProbe": http_probe(
            "/healthz",
            names.PROBE_PORT_NAME,
            initialDelaySeconds=10,
            periodSeconds=10,
            failureThreshold=6,
        ),
        "volumeMounts": worker_mounts(pipeline),
        "securityContext": security_contexts(body)[1],
    }
    if config.worker_image_pull_policy:
        container["imagePullPolicy"] = config.worker_image_pull_policy
    resources = worker_resources(spec, pipeline, config)
    if resources:
        container["resources"] = resources
    return container


def worker_resources(
    spec: Mapping[str, Any], pipeline: PipelineSpec, config: OperatorConfig
) -> JSON:
    """The worker container's resources: spec.resources when the pipeline sets it (whole, not
    merged: a request of its own above a default limit would make an invalid pod), else the
    operator's default (the chart's workerDefaults), the Spark one for a Spark sink. The same
    for the Deployment's worker, the injected worker and the redrive Job."""
    if spec.get("resources"):
        return copy.deepcopy(dict(spec["resources"]))
    spark = pipeline.sink.spark is not None
    return copy.deepcopy(config.worker_spark_resources if spark else config.worker_resources)


def processor_container(body: Mapping[str, Any]) -> JSON:
    """Sidecar mode: the user's container as a native sidecar (an init container that keeps
    running). Kubernetes starts it before the worker and stops it only after the worker has
    exited, so a draining worker can still send its last batches to it."""
    raw = body["spec"]["processor"]["container"]
    port = raw.get("port", 8080)
    container: JSON = {
        "name": names.PROCESSOR_CONTAINER,
        "image": raw["image"],
        "restartPolicy": "Always",
        "ports": [{"name": names.PROCESSOR_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        # The worker itself waits for /healthz before consuming; the startup probe keeps the
        # worker container from even starting until the processor answers.
        "startupProbe": http_probe(
            "/healthz", names.PROCESSOR_PORT_NAME, periodSeconds=2, failureThreshold=90
        ),
        "readinessProbe": http_probe("/healthz", names.PROCESSOR_PORT_NAME, periodSeconds=5),
        "securityContext": security_contexts(body)[2],
        # A read-only root filesystem: the user's container gets its own writable /tmp.
        "volumeMounts": [{"name": "processor-tmp", "mountPath": "/tmp"}],
    }
    for key in ("command", "args", "env", "envFrom", "resources", "imagePullPolicy"):
        if raw.get(key):
            container[key] = copy.deepcopy(raw[key])
    return container


def secret_key_env(pipeline: PipelineSpec) -> list[JSON]:
    """The ``*SecretRef: {name, key}`` fields (jdbc and iceberg passwords, the Spark Connect
    token) as environment variables from their Secrets: the value is in neither the
    ConfigMap nor the pod spec, and the worker reads it from its environment
    (offtake.config.secret_env)."""
    return [
        {"name": variable, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
        for variable, ref in secret_envs(pipeline)
    ]


def jdbc_secret_name(pipeline: PipelineSpec) -> str | None:
    spark = pipeline.sink.spark
    if spark is None or spark.jdbc is None or spark.jdbc.secret_ref is None:
        return None
    return str(spark.jdbc.secret_ref.name)


def _kafka_secret_volume(
    pipeline: PipelineSpec, mounts: Sequence[tuple[str, Mapping[str, str]]] | None
) -> JSON | None:
    """One directory of property files: a Secret volume, or a projected volume when the
    credentials and the cluster CA come from two Secrets."""
    if mounts is None:
        ref = pipeline.kafka.secret_ref
        return None if ref is None else {"name": "kafka-secret", "secret": {"secretName": ref.name}}
    if not mounts:
        return None

    def items(files: Mapping[str, str]) -> list[JSON]:
        return [{"key": k, "path": p} for k, p in sorted(files.items())]

    if len(mounts) == 1:
        ((name, files),) = mounts
        return {"name": "kafka-secret", "secret": {"secretName": name, "items": items(files)}}
    sources = [{"secret": {"name": name, "items": items(files)}} for name, files in mounts]
    return {"name": "kafka-secret", "projected": {"sources": sources}}


def pod_volumes(
    name: str, pipeline: PipelineSpec, kafka_mounts: Sequence[tuple[str, Mapping[str, str]]] | None
) -> list[JSON]:
    volumes: list[JSON] = [
        {"name": "pipeline", "configMap": {"name": names.configmap_name(name)}},
        {"name": "tmp", "emptyDir": {}},
    ]
    kafka_volume = _kafka_secret_volume(pipeline, kafka_mounts)
    if kafka_volume is not None:
        volumes.append(kafka_volume)
    jdbc_secret = jdbc_secret_name(pipeline)
    if jdbc_secret is not None:
        volumes.append({"name": "jdbc-secret", "secret": {"secretName": jdbc_secret}})
    for i, secret in enumerate(schema_registry_secrets(pipeline)):
        volumes.append({"name": f"schema-registry-secret-{i}", "secret": {"secretName": secret}})
    return volumes


def schema_registry_secrets(pipeline: PipelineSpec) -> list[str]:
    """The Secrets of the source's and the Kafka sink's schema registries, each once."""
    refs = [pipeline.source.schema_registry]
    if pipeline.sink.kafka is not None:
        refs.append(pipeline.sink.kafka.schema_registry)
    names_ = [r.secret_ref.name for r in refs if r is not None and r.secret_ref is not None]
    return sorted(set(names_))


#: Pod settings of spec.template.spec copied to every pod the operator renders.
POD_SETTINGS = (
    "serviceAccountName",
    "priorityClassName",
    "nodeSelector",
    "imagePullSecrets",
    "tolerations",
    "affinity",
)


def copy_pod_settings(template_spec: Mapping[str, Any], pod_spec: JSON) -> None:
    for key in POD_SETTINGS:
        if template_spec.get(key):
            pod_spec[key] = copy.deepcopy(template_spec[key])


def check_pod_template(spec: Mapping[str, Any]) -> None:
    """spec.template is the operator's alone (the worker's loader never reads it): name the
    field when it is not a mapping, instead of failing inside rendering (found by
    tests/chaos/test_bad_manifests.py: "template: true" reached the catch-all below)."""
    template = spec.get("template")
    if template is None:
        return
    if not isinstance(template, Mapping):
        raise ConfigError("spec.template", "expected a mapping (a pod template)")
    for key in ("spec", "metadata"):
        inner = template.get(key)
        if inner is not None and not isinstance(inner, Mapping):
            raise ConfigError(f"spec.template.{key}", "expected a mapping")
    pod = template.get("spec") or {}
    for key in ("securityContext", "containerSecurityContext"):
        inner = pod.get(key)
        if inner is not None and not isinstance(inner, Mapping):
            raise ConfigError(f"spec.template.spec.{key}", "expected a mapping")


def check_security(body: Mapping[str, Any], pipeline: PipelineSpec) -> None:
    """Refuse overrides that Pod Security ``restricted`` would refuse (see
    :mod:`offtake_operator.security`)."""
    check_pod_template(body.get("spec") or {})
    pod, worker, processor = security_contexts(body)
    security.check_pod(pod, "spec.template.spec.securityContext")
    security.check_container(worker, pod, "spec.template.spec.containerSecurityContext")
    if pipeline.processor.container is not None:
        security.check_container(processor, pod, "spec.processor.container.securityContext")
