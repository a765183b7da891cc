"""``submit.mode: kubernetes``: a Spark Connect server per pipeline, run by the spark-operator.

The operator renders a ``SparkConnect`` (the Kubeflow Spark operator's
``sparkoperator.k8s.io/v1alpha1``) owned by the pipeline, from ``sink.spark.submit``: its
image, the server's and executors' resources, the service account, the sink's packages and
conf. The Spark operator runs the server pod and a Service ``<name>-server`` in front of its
gRPC port; the workers connect to it as Spark Connect clients (no JVM in the worker pod).
The URL is derived here from the pipeline's name and namespace, so the operator (which puts it
in the workers' environment as ``OFFTAKE_SPARK_CONNECT_URL``) and the worker agree on it.

The server takes SQL and Python, so it is not open to whoever reaches it:

- it requires a per-pipeline token (Spark Connect's pre-shared key: the server reads
  ``SPARK_CONNECT_AUTHENTICATE_TOKEN``, clients send ``authorization: Bearer <token>``). The
  operator generates it into a Secret it owns (:func:`token_secret_name`); server and workers
  get it through ``secretKeyRef``, never as a literal in a spec;
- the server and executor pods carry :data:`SPARK_POD_LABEL` (not the pipeline label: the
  workers' Deployment, Service and status select by that), which the operator's
  NetworkPolicies select: the Connect port only from this pipeline's workers;
- the pods run with Pod Security ``restricted`` contexts (Spark's image user,
  :data:`SPARK_UID`), and ``submit.conf`` may not reshape them
  (:mod:`offtake.config.spark_conf`).
"""

from __future__ import annotations

from typing import Any

from offtake.config.spec import PipelineSpec, SparkSinkSpec
from offtake.sinks.spark.session import (
    CONNECT_PORT,
    CONNECT_TOKEN_ENV,
    CONNECT_URL_ENV,
    TOKEN_KEY,
    kubernetes_connect_url,
    session_config,
    spark_connect_name,
    token_secret_name,
)

__all__ = [
    "CONNECT_PORT",
    "CONNECT_TOKEN_ENV",
    "CONNECT_URL_ENV",
    "SERVER_TOKEN_ENV",
    "SPARK_POD_LABEL",
    "SPARK_ROLE_LABEL",
    "TOKEN_KEY",
    "kubernetes_connect_url",
    "render_spark_connect_spec",
    "spark_connect_name",
    "spark_pod_labels",
    "token_secret_name",
]

#: Where Spark Connect's server reads its pre-shared token from.
SERVER_TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
#: Labels of the Spark pods: which pipeline's server or executor a pod is.
SPARK_POD_LABEL = "offtake.dev/spark-connect"
SPARK_ROLE_LABEL = "offtake.dev/spark-role"
#: The apache/spark image's own user (spark, 185): its entrypoint and SPARK_HOME expect it.
SPARK_UID = 185
# The container names the Spark operator (server) and Spark (executors) look for.
SERVER_CONTAINER = "spark-kubernetes-driver"
EXECUTOR_CONTAINER = "spark-kubernetes-executor"

#: Pod Security restricted, for the server and executor pods (offtake_operator.security has
#: the same defaults for the workers; this package must not import the operator's).
SPARK_POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": SPARK_UID,
    "runAsGroup": SPARK_UID,
    "fsGroup": SPARK_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
#: Not readOnlyRootFilesystem: Spark's launch scripts write under SPARK_HOME (logs, work
#: dirs); restricted does not ask for it.
SPARK_CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def spark_pod_labels(pipeline: str, role: str) -> dict[str, str]:
    return {SPARK_POD_LABEL: pipeline, SPARK_ROLE_LABEL: role}


#: Spark's switch between the driver's bind address and spark.driver.host for executors.
USE_DRIVER_POD_IP = "spark.kubernetes.executor.useDriverPodIP"

API_VERSION = "sparkoperator.k8s.io/v1alpha1"
KIND = "SparkConnect"
# The Spark of the worker-spark image (the pyspark the worker is built with): the server must
# speak the same Spark Connect protocol. tests/spark/test_kubernetes.py checks it against
# the installed pyspark.
SPARK_VERSION = "4.3.0"
DEFAULT_IMAGE = f"apache/spark:{SPARK_VERSION}"


def _spark(pipeline: PipelineSpec) -> SparkSinkSpec:
    if pipeline.sink.spark is None:
        raise ValueError("sink.spark: the pipeline has no spark sink")
    return pipeline.sink.spark


def server_conf(pipeline: PipelineSpec) -> dict[str, str]:
    """The server's Spark conf: the sink's (its format's extensions, ``submit.conf``) and its
    packages; the worker's local Ivy folder and settings file stay out (paths in the worker's
    image, absent from the server pod, which resolves with its own Spark's settings)."""
    cfg = session_config(_spark(pipeline), pipeline.name, pipeline.namespace)
    local_paths = ("spark.jars.ivy", "spark.jars.ivySettings")
    conf = {k: v for k, v in cfg.conf.items() if k not in local_paths}
    conf["spark.jars.ivy"] = "/tmp/.ivy2"  # a writable place in the server pod
    # Since Spark 4.1 (default true) executors are told the driver's *bind* address, and the
    # Spark operator's server binds 0.0.0.0 (spark.driver.bindAddress) and names its pod IP in
    # spark.driver.host: every executor dialled 0.0.0.0:7078, was refused, exited, and after
    # four of them the server stopped (found on the node tier's first run). False: the
    # executors use spark.driver.host, the server pod's IP. A pipeline cannot set it
    # (spark.kubernetes.* is refused: config/spark_conf.py).
    conf[USE_DRIVER_POD_IP] = "false"
    if cfg.packages:
        conf["spark.jars.packages"] = ",".join(cfg.packages)
    return conf


def render_spark_connect_spec(pipeline: PipelineSpec) -> dict[str, Any]:
    """The ``spec`` of the pipeline's SparkConnect (the operator adds the metadata)."""
    submit = _spark(pipeline).submit
    server: dict[str, Any] = {"cores": submit.server.cores, "memory": submit.server.memory}
    executor: dict[str, Any] = {
        "instances": submit.executors.instances,
        "cores": submit.executors.cores,
        "memory": submit.executors.memory,
    }
    secret = token_secret_name(pipeline.name)
    server["template"] = _template(
        pipeline.name,
        "server",
        {
            "name": SERVER_CONTAINER,
            "securityContext": dict(SPARK_CONTAINER_SECURITY),
            "env": [
                {
                    "name": SERVER_TOKEN_ENV,
                    "valueFrom": {"secretKeyRef": {"name": secret, "key": TOKEN_KEY}},
                }
            ],
        },
        submit.service_account,
    )
    executor["template"] = _template(
        pipeline.name,
        "executor",
        {"name": EXECUTOR_CONTAINER, "securityContext": dict(SPARK_CONTAINER_SECURITY)},
        submit.service_account,
    )
    return {
        "sparkVersion": SPARK_VERSION,
        "image": submit.image or DEFAULT_IMAGE,
        "sparkConf": server_conf(pipeline),
        "server": server,
        "executor": executor,
    }


def _template(
    pipeline: str, role: str, container: dict[str, Any], service_account: str | None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"securityContext": dict(SPARK_POD_SECURITY), "containers": [container]}
    if role == "executor":
        # The server (Spark's driver) creates the executor pods through the API and keeps its
        # token; an executor never calls the API.
        spec["automountServiceAccountToken"] = False
    if service_account:
        spec["serviceAccountName"] = service_account
    return {"metadata": {"labels": spark_pod_labels(pipeline, role)}, "spec": spec}
