"""``submit.mode: kubernetes``: Spark on the cluster, rendered here, run by Kubernetes.

The worker keeps one long-lived session, so the cluster side is a long-lived Spark Connect
server: a SparkApplication (sparkoperator.k8s.io/v1beta2) whose driver runs the Connect
server class, with the sink's packages and conf, plus a Service in front of its gRPC port. The
worker then connects to ``sc://<name>-spark-connect.<namespace>:15002``. For clusters without
the spark-operator, :func:`spark_submit_command` renders the equivalent spark-submit in
cluster mode against a ``k8s://`` master. Nothing here talks to a cluster; the operator
applies what this renders.

Image and service account come from the standard Spark keys in ``submit.conf``
(``spark.kubernetes.container.image``,
``spark.kubernetes.authenticate.driver.serviceAccountName``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from offtake.config.spec import PipelineSpec, SparkSinkSpec
from offtake.sinks.spark.session import session_config, spark_version

CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
CONNECT_PORT = 15002
IMAGE_KEY = "spark.kubernetes.container.image"
ACCOUNT_KEY = "spark.kubernetes.authenticate.driver.serviceAccountName"
DEFAULT_IMAGE = "apache/spark:{version}-scala2.13-java17-python3-ubuntu"
# Spark's own jar of the Connect server, in the apache/spark images.
CONNECT_JAR = "local:///opt/spark/jars/spark-connect_2.13-{version}.jar"


class KubernetesRenderError(Exception):
    """A rendered object does not fit its schema; the message names the field."""


def connect_service_name(pipeline: PipelineSpec) -> str:
    return f"{pipeline.name}-spark-connect"


def connect_url(pipeline: PipelineSpec) -> str:
    """Where the worker reaches the rendered server (submit.connectUrl, if set, wins)."""
    spark = _spark(pipeline)
    if spark.submit.connect_url:
        return spark.submit.connect_url
    return f"sc://{connect_service_name(pipeline)}.{pipeline.namespace}:{CONNECT_PORT}"


def _spark(pipeline: PipelineSpec) -> SparkSinkSpec:
    if pipeline.sink.spark is None:
        raise KubernetesRenderError("sink.spark: the pipeline has no spark sink")
    return pipeline.sink.spark


def _labels(pipeline: PipelineSpec) -> dict[str, str]:
    return {
        "app.kubernetes.io/managed-by": "offtake",
        "offtake.dev/pipeline": pipeline.name,
        "offtake.dev/component": "spark-connect",
    }


def _server_conf(pipeline: PipelineSpec) -> dict[str, str]:
    cfg = session_config(_spark(pipeline), pipeline.name)
    conf = {k: v for k, v in cfg.conf.items() if k != "spark.jars.ivy"}
    conf["spark.connect.grpc.binding.port"] = str(CONNECT_PORT)
    conf.setdefault("spark.jars.ivy", "/tmp/.ivy2")  # a writable place in the driver pod
    return conf


def render_spark_application(
    pipeline: PipelineSpec,
    *,
    executors: int = 2,
    driver_memory: str = "2g",
    executor_memory: str = "2g",
    version: str | None = None,
) -> dict[str, Any]:
    """A SparkApplication running the Spark Connect server for this pipeline's sink."""
    spark = _spark(pipeline)
    version = version or spark_version()
    cfg = session_config(spark, pipeline.name)
    conf = _server_conf(pipeline)
    image = conf.pop(IMAGE_KEY, DEFAULT_IMAGE.format(version=version))
    account = conf.pop(ACCOUNT_KEY, "spark")
    labels = _labels(pipeline)
    app: dict[str, Any] = {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {
            "name": connect_service_name(pipeline),
            "namespace": pipeline.namespace,
            "labels": labels,
        },
        "spec": {
            "type": "Scala",
            "mode": "cluster",
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "mainClass": CONNECT_CLASS,
            "mainApplicationFile": CONNECT_JAR.format(version=version),
            "sparkVersion": version,
            "sparkConf": conf,
            "deps": {"packages": list(cfg.packages)},
            # A long-lived server: restart it when it dies, the worker reconnects.
            "restartPolicy": {
                "type": "Always",
                "onFailureRetryInterval": 10,
                "onSubmissionFailureRetryInterval": 20,
            },
            "driver": {
                "cores": 1,
                "memory": driver_memory,
                "serviceAccount": account,
                "labels": labels,
                "ports": [
                    {"name": "spark-connect", "containerPort": CONNECT_PORT, "protocol": "TCP"}
                ],
            },
            "executor": {
                "instances": executors,
                "cores": 1,
                "memory": executor_memory,
                "labels": labels,
            },
        },
    }
    if not cfg.packages:
        del app["spec"]["deps"]
    return app


def render_connect_service(pipeline: PipelineSpec) -> dict[str, Any]:
    """The Service the worker connects through (selects the server's driver pod)."""
    labels = _labels(pipeline)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": connect_service_name(pipeline),
            "namespace": pipeline.namespace,
            "labels": labels,
        },
        "spec": {
            "selector": {**labels, "spark-role": "driver"},
            "ports": [
                {
                    "name": "spark-connect",
                    "port": CONNECT_PORT,
                    "targetPort": CONNECT_PORT,
                    "protocol": "TCP",
                }
            ],
        },
    }


def spark_submit_command(pipeline: PipelineSpec, version: str | None = None) -> list[str]:
    """spark-submit (cluster mode, ``k8s://`` master) starting the same Connect server."""
    spark = _spark(pipeline)
    master = spark.submit.master
    if not master.startswith("k8s://"):
        raise KubernetesRenderError(
            f"sink.spark.submit.master: {master!r} must be a k8s:// URL for spark-submit"
        )
    version = version or spark_version()
    cfg = session_config(spark, pipeline.name)
    conf = _server_conf(pipeline)
    conf.setdefault(IMAGE_KEY, DEFAULT_IMAGE.format(version=version))
    conf.setdefault("spark.kubernetes.namespace", pipeline.namespace)
    conf.setdefault("spark.kubernetes.driver.label.offtake.dev/pipeline", pipeline.name)
    conf.setdefault("spark.kubernetes.driver.label.offtake.dev/component", "spark-connect")
    cmd = [
        "spark-submit",
        "--master",
        master,
        "--deploy-mode",
        "cluster",
        "--name",
        connect_service_name(pipeline),
        "--class",
        CONNECT_CLASS,
    ]
    if cfg.packages:
        cmd += ["--packages", ",".join(cfg.packages)]
    for key in sorted(conf):
        cmd += ["--conf", f"{key}={conf[key]}"]
    cmd.append(CONNECT_JAR.format(version=version))
    return cmd


# -- validation against the CRD's openAPIV3Schema ---------------------------------------------
def crd_schema(crd: Mapping[str, Any], version: str = "v1beta2") -> Mapping[str, Any]:
    """The openAPIV3Schema of one version of a CustomResourceDefinition."""
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            schema: Mapping[str, Any] = v["schema"]["openAPIV3Schema"]
            return schema
    raise KubernetesRenderError(f"the CRD has no version {version}")


def validate(obj: Any, schema: Mapping[str, Any], path: str = "") -> list[str]:
    """Errors of ``obj`` against a structural schema (the subset CRDs use), by field path.

    Checks type, required, properties (unknown fields are errors, as the API server prunes
    them silently and we want to know), additionalProperties, items, enum and minimum.
    """
    errors: list[str] = []
    where = path or "<root>"
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(obj, int | str) or isinstance(obj, bool):
            errors.append(f"{where}: expected an integer or a string")
        return errors
    kind = schema.get("type")
    if kind is not None and not _is_type(obj, kind):
        return [f"{where}: expected {kind}, got {type(obj).__name__}"]
    if "enum" in schema and obj not in schema["enum"]:
        errors.append(f"{where}: {obj!r} is not one of {schema['enum']}")
    if "minimum" in schema and isinstance(obj, int | float) and obj < schema["minimum"]:
        errors.append(f"{where}: {obj} is below the minimum {schema['minimum']}")
    if isinstance(obj, Mapping):
        props: Mapping[str, Any] = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in obj:
                errors.append(f"{path + '.' if path else ''}{name}: required")
        extra = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
        for key, value in obj.items():
            sub = f"{path}.{key}" if path else str(key)
            if key in props:
                errors += validate(value, props[key], sub)
            elif isinstance(extra, Mapping):
                errors += validate(value, extra, sub)
            elif props and not preserve and extra is not True:
                errors.append(f"{sub}: unknown field")
    if isinstance(obj, list) and "items" in schema:
        for i, value in enumerate(obj):
            errors += validate(value, schema["items"], f"{path}[{i}]")
    return errors


def _is_type(obj: Any, kind: str) -> bool:
    if kind == "object":
        return isinstance(obj, Mapping)
    if kind == "array":
        return isinstance(obj, list)
    if kind == "string":
        return isinstance(obj, str)
    if kind == "boolean":
        return isinstance(obj, bool)
    if kind == "integer":
        return isinstance(obj, int) and not isinstance(obj, bool)
    if kind == "number":
        return isinstance(obj, int | float) and not isinstance(obj, bool)
    return True
