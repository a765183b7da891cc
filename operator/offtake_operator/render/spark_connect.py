"""A pipeline's Spark Connect server (sink.spark.submit.mode kubernetes): the SparkConnect,
its token Secret and the NetworkPolicies of its pods."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from offtake.contract import PipelineSpec
from offtake.contract import spark_kubernetes as spark_k8s

from .. import names
from .metadata import JSON, child_metadata, meta


def uses_spark_connect(pipeline: PipelineSpec) -> bool:
    """True when the operator runs a Spark Connect server for the pipeline."""
    spark = pipeline.sink.spark
    return spark is not None and spark.submit.mode == "kubernetes"


def render_spark_connect(body: Mapping[str, Any], pipeline: PipelineSpec) -> JSON:
    """The pipeline's Spark Connect server, a SparkConnect of the Kubeflow Spark operator."""
    name, _ = meta(body)
    metadata = child_metadata(body, spark_k8s.spark_connect_name(name), "spark-connect")
    # The Spark operator copies a SparkConnect's labels onto every executor pod (as
    # spark.kubernetes.executor.label.*). With the pipeline's label there the workers'
    # selectors took the executors for workers: the PodDisruptionBudget failed ("pods does
    # not implement the scale subresource"), and the Service and the scale selector matched
    # them. Its pods carry offtake.dev/spark-connect instead (spark_k8s.spark_pod_labels).
    metadata["labels"].pop(names.PIPELINE_LABEL)
    return {
        "apiVersion": spark_k8s.API_VERSION,
        "kind": spark_k8s.KIND,
        "metadata": metadata,
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


def owned_token(existing: Mapping[str, Any] | None, uid: str) -> str | None:
    """The token in ``existing`` (the token Secret as read) when the pipeline of ``uid`` owns
    it, so that a pass never changes it under the running server; None otherwise (a Secret
    the pipeline does not own is left to apply, which refuses it, naming it)."""
    refs = ((existing or {}).get("metadata") or {}).get("ownerReferences") or []
    encoded = ((existing or {}).get("data") or {}).get(spark_k8s.TOKEN_KEY)
    if encoded and any(r.get("uid") == uid and r.get("controller") for r in refs):
        try:
            return base64.b64decode(encoded, validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            pass  # not a token of ours: a new one replaces it
    return None
