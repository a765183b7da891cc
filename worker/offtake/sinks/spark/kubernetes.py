"""``submit.mode: kubernetes``: a Spark Connect server per pipeline, run by the spark-operator.

The operator renders a ``SparkConnect`` (the Kubeflow Spark operator's
``sparkoperator.k8s.io/v1alpha1``) owned by the pipeline, from ``sink.spark.submit``: its
image, the server's and executors' resources, the service account, the sink's packages and
conf. The Spark operator runs the server pod and a Service ``<name>-server`` in front of its
gRPC port; the workers connect to it as Spark Connect clients (no JVM in the worker pod).
The URL is derived here from the pipeline's name and namespace, so the operator (which puts it
in the workers' environment as ``OFFTAKE_SPARK_CONNECT_URL``) and the worker agree on it.
"""

from __future__ import annotations

from typing import Any

from offtake.config.spec import PipelineSpec, SparkSinkSpec
from offtake.sinks.spark.session import (
    CONNECT_URL_ENV,
    kubernetes_connect_url,
    session_config,
    spark_connect_name,
)

__all__ = [
    "CONNECT_URL_ENV",
    "kubernetes_connect_url",
    "render_spark_connect_spec",
    "spark_connect_name",
]

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
    packages; the worker's local Ivy folder stays out (the server pod has its own)."""
    cfg = session_config(_spark(pipeline), pipeline.name, pipeline.namespace)
    conf = {k: v for k, v in cfg.conf.items() if k != "spark.jars.ivy"}
    conf["spark.jars.ivy"] = "/tmp/.ivy2"  # a writable place in the server pod
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
    if submit.service_account:
        for part in (server, executor):
            part["template"] = {"spec": {"serviceAccountName": submit.service_account}}
    return {
        "sparkVersion": SPARK_VERSION,
        "image": submit.image or DEFAULT_IMAGE,
        "sparkConf": server_conf(pipeline),
        "server": server,
        "executor": executor,
    }
