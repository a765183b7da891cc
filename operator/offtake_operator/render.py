"""Pure functions from a ConsumerPipeline to the child objects that run it.

Nothing here talks to the API: the same input always renders the same dicts, which is what
makes reconciling level-based (render, compare, patch the difference) and easy to test.
"""

from __future__ import annotations

import base64
import copy
import functools
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from offtake.contract import (
    LAG_MESSAGES_METRIC,
    LAG_SECONDS_METRIC,
    OPERATOR_ONLY_FIELDS,
    PipelineSpec,
    RedriveRequest,
    secret_envs,
)
from offtake.contract import spark_kubernetes as spark_k8s

from . import names, queue_autoscaling
from .names import API_VERSION, KIND
from .operator_spec import Autoscaling
from .security import CONTAINER_DEFAULTS, POD_DEFAULTS, merged
from .settings import OperatorConfig
from .worker_probes import probe_args, probe_port

JSON = dict[str, Any]

#: Spec fields that shape the Deployment rather than the worker's behaviour. They stay out of
#: the worker's pipeline.yaml so that, e.g., scaling or pausing does not change the config
#: checksum and roll every pod.
DEPLOYMENT_ONLY_FIELDS = ("replicas", "paused", *OPERATOR_ONLY_FIELDS)


def meta(body: Mapping[str, Any]) -> tuple[str, str]:
    m = body["metadata"]
    return str(m["name"]), str(m.get("namespace") or "default")


def pipeline_document(
    body: Mapping[str, Any], kafka_config: Mapping[str, str] | None = None
) -> JSON:
    """The manifest the worker reads: this resource without status and deployment-only fields.

    ``kafka_config`` adds librdkafka properties the operator derived (the SCRAM user name of a
    Strimzi Secret); the pipeline's own ``kafka.config`` wins over them.
    """
    name, namespace = meta(body)
    spec = {k: copy.deepcopy(v) for k, v in body["spec"].items() if k not in DEPLOYMENT_ONLY_FIELDS}
    if kafka_config:
        kafka = spec.setdefault("kafka", {})
        kafka["config"] = {**kafka_config, **(kafka.get("config") or {})}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def pipeline_yaml(body: Mapping[str, Any], kafka_config: Mapping[str, str] | None = None) -> str:
    # Every pass renders it twice (ConfigMap, checksum): PyYAML's emitter is slow enough to
    # matter at a thousand pipelines, the JSON key of the same document is not.
    return _yaml_of(json.dumps(pipeline_document(body, kafka_config), sort_keys=True))


@functools.lru_cache(maxsize=4096)
def _yaml_of(document: str) -> str:
    # sort_keys: the same spec must always give the same text, hence the same checksum.
    return yaml.safe_dump(json.loads(document), sort_keys=True, default_flow_style=False)


def checksum(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def owner_reference(body: Mapping[str, Any]) -> JSON:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": body["metadata"]["name"],
        "uid": body["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def labels(pipeline: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "offtake",
        "app.kubernetes.io/instance": pipeline,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": names.MANAGED_BY,
        names.PIPELINE_LABEL: pipeline,
        names.COMPONENT_LABEL: component,
    }


def child_metadata(body: Mapping[str, Any], name: str, component: str) -> JSON:
    pipeline, namespace = meta(body)
    return {
        "name": name,
        "namespace": namespace,
        "labels": labels(pipeline, component),
        "ownerReferences": [owner_reference(body)],
    }


def render_configmap(
    body: Mapping[str, Any], kafka_config: Mapping[str, str] | None = None
) -> JSON:
    pipeline, _ = meta(body)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(body, names.configmap_name(pipeline), "config"),
        "data": {names.CONFIG_KEY: pipeline_yaml(body, kafka_config)},
    }


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


def desired_worker_replicas(pipeline: PipelineSpec, *, rewinding: bool) -> int:
    """Workers to run: none while paused or while a rewind needs the group empty."""
    if pipeline.paused or rewinding:
        return 0
    return int(pipeline.replicas)


def grace_period_seconds(pipeline: PipelineSpec) -> int:
    # Above the drain budget: the worker needs time after draining to flush the producer,
    # commit and leave the group before the kubelet's SIGKILL.
    return math.ceil(float(pipeline.shutdown.drain_timeout_seconds)) + names.GRACE_EXTRA_SECONDS


def _http_probe(path: str, port: str, **timing: int) -> JSON:
    return {"httpGet": {"path": path, "port": port}, **timing}


def _worker_container(
    body: Mapping[str, Any], pipeline: PipelineSpec, config: OperatorConfig
) -> JSON:
    spec = body["spec"]
    template_spec = (spec.get("template") or {}).get("spec") or {}
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
    env += copy.deepcopy(template_spec.get("env") or [])
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
    if _jdbc_secret(pipeline) is not None:
        mounts.append({"name": "jdbc-secret", "mountPath": names.JDBC_SECRET_DIR, "readOnly": True})
    for i, secret in enumerate(schema_registry_secrets(pipeline)):
        mounts.append(
            {
                "name": f"schema-registry-secret-{i}",
                "mountPath": f"{names.SCHEMA_REGISTRY_SECRETS_DIR}/{secret}",
                "readOnly": True,
            }
        )
    container: JSON = {
        "name": names.WORKER_CONTAINER,
        "image": spec.get("image")
        or (config.worker_spark_image if pipeline.sink.spark is not None else config.worker_image),
        "command": ["offtake"],
        "args": ["worker", "--pipeline", names.PIPELINE_PATH, *probe_args(pipeline)],
        "env": env,
        "ports": [
            {
                "name": names.METRICS_PORT_NAME,
                "containerPort": pipeline.metrics.port,
                "protocol": "TCP",
            },
            probe_port(pipeline),
        ],
        # Not ready while starting, draining or stopped: the rollout waits for a real consumer.
        "readinessProbe": _http_probe(
            "/readyz", names.PROBE_PORT_NAME, periodSeconds=5, failureThreshold=2
        ),
        "livenessProbe": _http_probe(
            "/healthz",
            names.PROBE_PORT_NAME,
            initialDelaySeconds=10,
            periodSeconds=10,
            failureThreshold=6,
        ),
        "volumeMounts": mounts,
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


def _processor_container(body: Mapping[str, Any]) -> JSON:
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
        "startupProbe": _http_probe(
            "/healthz", names.PROCESSOR_PORT_NAME, periodSeconds=2, failureThreshold=90
        ),
        "readinessProbe": _http_probe("/healthz", names.PROCESSOR_PORT_NAME, periodSeconds=5),
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


def _jdbc_secret(pipeline: PipelineSpec) -> str | None:
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


def _volumes(
    name: str, pipeline: PipelineSpec, kafka_mounts: Sequence[tuple[str, Mapping[str, str]]] | None
) -> list[JSON]:
    volumes: list[JSON] = [
        {"name": "pipeline", "configMap": {"name": names.configmap_name(name)}},
        {"name": "tmp", "emptyDir": {}},
    ]
    kafka_volume = _kafka_secret_volume(pipeline, kafka_mounts)
    if kafka_volume is not None:
        volumes.append(kafka_volume)
    jdbc_secret = _jdbc_secret(pipeline)
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


def _copy_pod_settings(template_spec: Mapping[str, Any], pod_spec: JSON) -> None:
    for key in POD_SETTINGS:
        if template_spec.get(key):
            pod_spec[key] = copy.deepcopy(template_spec[key])


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
    volumes = _volumes(name, pipeline, kafka_mounts)

    pod_spec: JSON = {
        "containers": [_worker_container(body, pipeline, config)],
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
        pod_spec["initContainers"] = [_processor_container(body)]
        volumes.append({"name": "processor-tmp", "emptyDir": {}})
    pod_spec["securityContext"] = security_contexts(body)[0]
    _copy_pod_settings(template_spec, pod_spec)

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
    worker = _worker_container(body, pipeline, config)
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
        "volumes": _volumes(name, pipeline, kafka_mounts),
        # A failed attempt's pod stays for its logs; the Job starts another (which resumes).
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        # `offtake redrive` talks to Kafka only, never to the Kubernetes API.
        "automountServiceAccountToken": False,
        "securityContext": security_contexts(body)[0],
    }
    _copy_pod_settings(template_spec, pod_spec)
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


def uses_spark_connect(pipeline: PipelineSpec) -> bool:
    """True when the operator runs a Spark Connect server for the pipeline."""
    spark = pipeline.sink.spark
    return spark is not None and spark.submit.mode == "kubernetes"


def render_spark_connect(body: Mapping[str, Any], pipeline: PipelineSpec) -> JSON:
    """The pipeline's Spark Connect server, a SparkConnect of the Kubeflow Spark operator."""
    name, _ = meta(body)
    return {
        "apiVersion": spark_k8s.API_VERSION,
        "kind": spark_k8s.KIND,
        "metadata": child_metadata(body, spark_k8s.spark_connect_name(name), "spark-connect"),
        "spec": spark_k8s.render_spark_connect_spec(pipeline),
    }


def render_spark_connect_token(body: Mapping[str, Any], token: str) -> JSON:
    """The Secret with the pipeline's Spark Connect token (generated once by the operator and
    kept: see reconcile), read by the server and the workers through secretKeyRef."""
    name, _ = meta(body)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": child_metadata(body, spark_k8s.token_secret_name(name), "spark-connect"),
        "type": "Opaque",
        # data, not stringData: the server returns data, and apply.covers compares with it.
        "data": {spark_k8s.TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def render_spark_network_policies(body: Mapping[str, Any]) -> list[JSON]:
    """NetworkPolicies of the pipeline's Spark pods: the Connect server takes its gRPC port
    only from this pipeline's workers (and anything from its own executors, which call back
    to the driver); the executors take traffic only from their server and each other.
    Only ingress: egress (object stores, databases, Maven) is the pipeline's business."""
    name, _ = meta(body)
    server = spark_k8s.spark_pod_labels(name, "server")
    executors = spark_k8s.spark_pod_labels(name, "executor")
    ours = {spark_k8s.SPARK_POD_LABEL: name}

    def policy(suffix: str, selected: dict[str, str], ingress: list[JSON]) -> JSON:
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": child_metadata(
                body, f"{spark_k8s.spark_connect_name(name)}-{suffix}", "spark-connect"
            ),
            "spec": {
                "podSelector": {"matchLabels": selected},
                "policyTypes": ["Ingress"],
                "ingress": ingress,
            },
        }

    return [
        policy(
            "server",
            server,
            [
                {
                    # Same namespace only (no namespaceSelector): the pipeline's worker pods.
                    "from": [{"podSelector": {"matchLabels": names.selector(name)}}],
                    "ports": [{"protocol": "TCP", "port": spark_k8s.CONNECT_PORT}],
                },
                {"from": [{"podSelector": {"matchLabels": executors}}]},
            ],
        ),
        policy("executors", executors, [{"from": [{"podSelector": {"matchLabels": ours}}]}]),
    ]


def render_pdb(body: Mapping[str, Any]) -> JSON:
    name, _ = meta(body)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": child_metadata(body, names.pdb_name(name), "worker"),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": names.selector(name)}},
    }


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


def replica_cap(pipeline: PipelineSpec, partitions: int | None) -> int | None:
    """The most workers that get work: the partition count in a consumer group; no cap in a
    share group (source.groupType share), whose members share every partition's records."""
    return None if pipeline.source.is_share_group else partitions


def replica_bounds(autoscaling: Autoscaling, partitions: int | None) -> tuple[int, int]:
    """(min, max) replicas, never above the partition count: an extra consumer would idle."""
    top = autoscaling.max_replicas
    if partitions:
        top = min(top, partitions)
    return min(autoscaling.min_replicas, top), top


def _scale_target(body: Mapping[str, Any]) -> JSON:
    return {"apiVersion": API_VERSION, "kind": KIND, "name": body["metadata"]["name"]}


def _behavior(autoscaling: Autoscaling) -> JSON:
    # Each scale step rebalances the group; damp scale-down so a drained backlog does not flap.
    return {
        "scaleDown": {"stabilizationWindowSeconds": autoscaling.scale_down_stabilization_seconds}
    }


def lag_seconds_query(body: Mapping[str, Any]) -> str:
    """PromQL for the pipeline's lag in seconds: its worst partition, over all workers."""
    name, namespace = meta(body)
    return f'max({LAG_SECONDS_METRIC}{{namespace="{namespace}", pipeline="{name}"}})'


def _hpa_metric(body: Mapping[str, Any], autoscaling: Autoscaling) -> JSON:
    if autoscaling.on_backlog:  # queue mode: the share group's backlog
        return queue_autoscaling.hpa_metric(meta(body)[0], autoscaling)
    if autoscaling.target_lag_seconds is None:
        # Total lag divided by the messages one worker is expected to carry.
        return {
            "type": "Pods",
            "pods": {
                "metric": {"name": LAG_MESSAGES_METRIC},
                "target": {
                    "type": "AverageValue",
                    "averageValue": str(autoscaling.target_lag_per_replica),
                },
            },
        }
    # Lag in seconds does not divide among pods: a Value target makes the HPA scale the
    # current replica count by (lag / target), up while the backlog ages, down as it drains.
    name, _ = meta(body)
    return {
        "type": "External",
        "external": {
            "metric": {
                "name": LAG_SECONDS_METRIC,
                "selector": {"matchLabels": {"pipeline": name}},
            },
            "target": {"type": "Value", "value": str(autoscaling.target_lag_seconds)},
        },
    }


def render_hpa(body: Mapping[str, Any], autoscaling: Autoscaling, partitions: int | None) -> JSON:
    """An HPA on the pipeline's scale subresource, on the workers' lag.

    In messages: a Pods metric offtake_consumer_lag_messages (a custom-metrics adapter such as
    prometheus-adapter serves it summed per pod), target total lag / targetLagPerReplica.
    In seconds: an External metric offtake_consumer_lag_seconds{pipeline=...} (the adapter
    serves the pipeline's maximum in the pipeline's namespace), target Value targetLagSeconds.
    """
    name, _ = meta(body)
    low, high = replica_bounds(autoscaling, partitions)
    # An HPA cannot scale to zero (the HPAScaleToZero gate is alpha): minReplicas 0 means 1.
    low = max(low, 1)
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": child_metadata(body, names.autoscaler_name(name), "autoscaler"),
        "spec": {
            "scaleTargetRef": _scale_target(body),
            "minReplicas": low,
            "maxReplicas": high,
            "metrics": [_hpa_metric(body, autoscaling)],
            "behavior": _behavior(autoscaling),
        },
    }


#: librdkafka property (a file of the mounted Kafka Secret) -> KEDA's Kafka scaler parameter.
KEDA_AUTH_PARAMETERS = {
    "sasl.username": "username",
    "sasl.password": "password",
    "ssl.ca.pem": "ca",
    "ssl.certificate.pem": "cert",
    "ssl.key.pem": "key",
    "ssl.key.password": "keyPassword",
}
_KEDA_SASL = {
    "PLAIN": "plaintext",
    "SCRAM-SHA-256": "scram_sha256",
    "SCRAM-SHA-512": "scram_sha512",
}


def keda_security(pipeline: PipelineSpec) -> dict[str, str]:
    """KEDA's ``sasl`` and ``tls`` trigger settings from the pipeline's (non-secret) config."""
    conf = pipeline.kafka.config
    out: dict[str, str] = {}
    mechanism = (conf.get("sasl.mechanism") or conf.get("sasl.mechanisms") or "").upper()
    if mechanism in _KEDA_SASL:
        out["sasl"] = _KEDA_SASL[mechanism]
    if conf.get("security.protocol", "").upper() in ("SSL", "SASL_SSL"):
        out["tls"] = "enable"
    return out


def render_trigger_authentication(
    body: Mapping[str, Any], kafka_mounts: Sequence[tuple[str, Mapping[str, str]]]
) -> JSON | None:
    """A KEDA TriggerAuthentication reading the pipeline's own Kafka Secret, so KEDA reaches a
    SASL/TLS cluster with the workers' credentials; None when the Secret has none KEDA takes."""
    name, _ = meta(body)
    refs = [
        {"parameter": KEDA_AUTH_PARAMETERS[prop], "name": secret_name, "key": key}
        for secret_name, files in kafka_mounts
        for key, prop in sorted(files.items())
        if prop in KEDA_AUTH_PARAMETERS
    ]
    if not refs:
        return None
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "TriggerAuthentication",
        "metadata": child_metadata(body, names.autoscaler_name(name), "autoscaler"),
        "spec": {"secretTargetRef": refs},
    }


def render_scaled_object(
    body: Mapping[str, Any],
    pipeline: PipelineSpec,
    autoscaling: Autoscaling,
    partitions: int | None,
    *,
    authenticated: bool = False,
) -> JSON:
    """A KEDA ScaledObject: KEDA's own Kafka scaler on lag in messages (no metrics adapter
    needed; ``authenticated``: its trigger uses the TriggerAuthentication of the same name),
    or its Prometheus scaler on lag in seconds."""
    name, _ = meta(body)
    low, high = replica_bounds(autoscaling, partitions)
    if autoscaling.on_backlog:  # queue mode: the share group's backlog
        scaler = queue_autoscaling.keda_trigger(*meta(body), autoscaling)
    elif autoscaling.on_seconds:
        scaler = _prometheus_trigger(body, autoscaling)
    else:
        scaler = _kafka_trigger(body, pipeline, autoscaling, authenticated=authenticated)
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": child_metadata(body, names.autoscaler_name(name), "autoscaler"),
        "spec": {
            "scaleTargetRef": _scale_target(body),
            "minReplicaCount": low,
            "maxReplicaCount": high,
            "pollingInterval": 15,
            # cooldownPeriod is only the wait before scaling to zero; the HPA that KEDA
            # creates takes the stabilisation window for every other scale-down.
            "cooldownPeriod": autoscaling.scale_down_stabilization_seconds,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(autoscaling)}},
            "triggers": [scaler],
        },
    }


def uses_scaled_object(autoscaling: Autoscaling, keda_served: bool) -> bool:
    """KEDA when installed, except for lag seconds or a queue-mode backlog without a
    Prometheus to ask: then the HPA on the external metric (served by a metrics adapter) is
    the one that can work."""
    return keda_served and (
        not autoscaling.asks_prometheus or autoscaling.prometheus_address is not None
    )


def _kafka_trigger(
    body: Mapping[str, Any],
    pipeline: PipelineSpec,
    autoscaling: Autoscaling,
    *,
    authenticated: bool,
) -> JSON:
    """KEDA's own Kafka scaler: it reads the group's lag in messages from the brokers."""
    name, _ = meta(body)
    trigger: dict[str, str] = {
        "bootstrapServers": pipeline.kafka.bootstrap_servers,
        "consumerGroup": pipeline.source.group_id,
        "lagThreshold": str(autoscaling.target_lag_per_replica),
        "offsetResetPolicy": pipeline.source.start_from,
    }
    # Without a topic KEDA's scaler counts every topic the group has offsets on: what a pattern
    # (or several topics) needs.
    if len(pipeline.source.topics) == 1 and not pipeline.source.patterns:
        trigger["topic"] = pipeline.source.topics[0]
    trigger.update(keda_security(pipeline))
    kafka_trigger: JSON = {"type": "kafka", "metadata": trigger}
    if authenticated:
        kafka_trigger["authenticationRef"] = {"name": names.autoscaler_name(name)}
    return kafka_trigger


def _prometheus_trigger(body: Mapping[str, Any], autoscaling: Autoscaling) -> JSON:
    """KEDA's Prometheus scaler on the lag in seconds (Kafka knows offsets, not record ages).
    metricType Value: the same proportional rule as the plain HPA's external metric."""
    return {
        "type": "prometheus",
        "metricType": "Value",
        "metadata": {
            "serverAddress": str(autoscaling.prometheus_address),
            "query": lag_seconds_query(body),
            "threshold": str(autoscaling.target_lag_seconds),
            # No worker scraped yet (or none running at zero): no lag, not an error.
            "ignoreNullValues": "true",
        },
    }
