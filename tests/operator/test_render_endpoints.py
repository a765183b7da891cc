"""What the operator renders to keep its endpoints authenticated or local: the Spark Connect
token (a Secret, read through secretKeyRef, never a literal), the NetworkPolicies of the Spark
pods, and no API token in pods that never call the API."""

from __future__ import annotations

import base64
import json
from typing import Any

from operator_testkit import pipeline_body

from offtake.config import parse_pipeline
from offtake_operator import render
from offtake_operator.reconcile import worker_manifest
from offtake_operator.settings import OperatorConfig

CONFIG = OperatorConfig(worker_image="registry.test/offtake:1.2.3")
SPARK_K8S = {"spark": {"format": "parquet", "path": "/data/out", "submit": {"mode": "kubernetes"}}}


def rendered(body: dict[str, Any]) -> dict[str, Any]:
    p = parse_pipeline(worker_manifest(body))
    return render.render_deployment(body, p, CONFIG, replicas=1)


def test_workers_read_the_connect_token_from_the_operators_secret() -> None:
    body = pipeline_body(sink=SPARK_K8S)
    pod = rendered(body)["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["OFFTAKE_SPARK_CONNECT_TOKEN"] == {
        "name": "OFFTAKE_SPARK_CONNECT_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "orders-spark-token", "key": "token"}},
    }
    secret = render.render_spark_connect_token(body, "s3cr3t-t0ken")
    assert secret["metadata"]["name"] == "orders-spark-token"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
    assert base64.b64decode(secret["data"]["token"]) == b"s3cr3t-t0ken"
    # Nowhere in what lands in the Deployment, the SparkConnect or the ConfigMap.
    p = parse_pipeline(worker_manifest(body))
    for obj in (
        rendered(body),
        render.render_spark_connect(body, p),
        render.render_configmap(body),
    ):
        assert "s3cr3t" not in json.dumps(obj)


def test_no_token_env_without_an_operator_run_server() -> None:
    local = {"spark": {"format": "parquet", "path": "/data/out"}}
    env = rendered(pipeline_body(sink=local))["spec"]["template"]["spec"]["containers"][0]["env"]
    assert not any(e["name"] == "OFFTAKE_SPARK_CONNECT_TOKEN" for e in env)


def test_the_connect_port_admits_only_this_pipelines_workers() -> None:
    server, executors = render.render_spark_network_policies(pipeline_body(sink=SPARK_K8S))
    assert server["kind"] == "NetworkPolicy" and server["metadata"]["namespace"] == "shop"
    assert server["spec"]["podSelector"] == {
        "matchLabels": {"offtake.dev/spark-connect": "orders", "offtake.dev/spark-role": "server"}
    }
    assert server["spec"]["policyTypes"] == ["Ingress"]
    workers, own_executors = server["spec"]["ingress"]
    # A podSelector alone: pods of this namespace only, with this pipeline's label.
    assert workers == {
        "from": [{"podSelector": {"matchLabels": {"offtake.dev/pipeline": "orders"}}}],
        "ports": [{"protocol": "TCP", "port": 15002}],
    }
    assert own_executors["from"] == [
        {
            "podSelector": {
                "matchLabels": {
                    "offtake.dev/spark-connect": "orders",
                    "offtake.dev/spark-role": "executor",
                }
            }
        }
    ]
    assert executors["spec"]["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": {"offtake.dev/spark-connect": "orders"}}}]}
    ]


def test_worker_pods_mount_no_api_token() -> None:
    assert (
        rendered(pipeline_body())["spec"]["template"]["spec"]["automountServiceAccountToken"]
        is False
    )


def test_a_template_variable_replaces_the_operators_of_that_name() -> None:
    # Two entries of one name in a container's env: the API server's apply refuses the whole
    # Deployment ("duplicate entries for key"), so no worker ran (the node tier's Spark test,
    # whose pods reach the server at its pod IP, found it).
    url = {"name": "OFFTAKE_SPARK_CONNECT_URL", "value": "sc://10.88.0.56:15002"}
    body = pipeline_body(sink=SPARK_K8S, template={"spec": {"env": [url, {"name": "X"}]}})
    env = rendered(body)["spec"]["template"]["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert len(names) == len(set(names)), names
    assert url in env and {"name": "X"} in env
    # The operator's others stay: the token from its Secret.
    assert "OFFTAKE_SPARK_CONNECT_TOKEN" in names


def test_the_spark_pods_do_not_carry_the_workers_label() -> None:
    # The Spark operator copies the SparkConnect's labels onto every executor pod; the workers'
    # Deployment, Service, PodDisruptionBudget and scale selector select the pipeline label.
    body = pipeline_body(sink=SPARK_K8S)
    spark_connect = render.render_spark_connect(body, parse_pipeline(worker_manifest(body)))
    labels = spark_connect["metadata"]["labels"]
    assert "offtake.dev/pipeline" not in labels
    assert labels["app.kubernetes.io/instance"] == "orders"
    assert labels["app.kubernetes.io/managed-by"] == "offtake-operator"
