"""The workers' Deployment (render.deployment)."""

from __future__ import annotations

from operator_testkit import pipeline_body
from render_testkit import deployment, parsed, pod_spec

from offtake_operator import render
from offtake_operator.settings import OperatorConfig


def test_deployment_runs_the_worker_with_probes_and_grace() -> None:
    body = pipeline_body(shutdown={"drainTimeoutSeconds": 40.5}, metrics={"port": 9200})
    dep = deployment(body)
    spec = dep["spec"]
    assert spec["replicas"] == 2
    assert spec["selector"] == {"matchLabels": {"offtake.dev/pipeline": "orders"}}
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    pod = spec["template"]
    assert pod["metadata"]["labels"]["offtake.dev/pipeline"] == "orders"
    (worker,) = pod["spec"]["containers"]
    assert worker["image"] == "registry.test/offtake:1.2.3"
    assert worker["command"] + worker["args"] == [
        "offtake",
        "worker",
        "--pipeline",
        "/etc/offtake/pipeline.yaml",
        "--probe-port",
        "9101",
    ]
    assert {
        "name": "POD_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
    } in worker["env"]
    assert worker["ports"] == [
        {"name": "metrics", "containerPort": 9200, "protocol": "TCP"},
        {"name": "probes", "containerPort": 9101, "protocol": "TCP"},
    ]
    # The kubelet's probes on a listener of their own, never behind the metrics port's slots.
    assert worker["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes"}
    assert worker["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "probes"}
    assert pod["spec"]["terminationGracePeriodSeconds"] == 41 + 15
    mount = next(m for m in worker["volumeMounts"] if m["name"] == "pipeline")
    assert mount["mountPath"] == "/etc/offtake/pipeline.yaml"
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "pipeline")
    assert volume["configMap"]["name"] == "orders-pipeline"
    assert "initContainers" not in pod["spec"]


def test_spec_image_and_resources_override_the_operator_defaults() -> None:
    body = pipeline_body(image="mine:7", resources={"limits": {"memory": "1Gi"}})
    (worker,) = pod_spec(body)["containers"]
    assert worker["image"] == "mine:7"
    assert worker["resources"] == {"limits": {"memory": "1Gi"}}


def test_paused_and_rewinding_run_no_workers() -> None:
    assert render.desired_worker_replicas(parsed(pipeline_body(replicas=3)), rewinding=False) == 3
    assert (
        render.desired_worker_replicas(
            parsed(pipeline_body(replicas=3, paused=True)), rewinding=False
        )
        == 0
    )
    assert render.desired_worker_replicas(parsed(pipeline_body(replicas=3)), rewinding=True) == 0


def test_template_overrides_reach_the_pod() -> None:
    body = pipeline_body(
        template={
            "metadata": {
                "labels": {"team": "shop", "offtake.dev/pipeline": "hijack"},
                "annotations": {"a": "b"},
            },
            "spec": {
                "serviceAccountName": "sa",
                "nodeSelector": {"pool": "kafka"},
                "env": [{"name": "X", "value": "1"}],
            },
        }
    )
    dep = deployment(body)
    meta = dep["spec"]["template"]["metadata"]
    assert meta["labels"]["team"] == "shop"
    assert meta["labels"]["offtake.dev/pipeline"] == "orders"  # the selector label always wins
    assert meta["annotations"]["a"] == "b"
    spec = dep["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "sa" and spec["nodeSelector"] == {"pool": "kafka"}
    assert {"name": "X", "value": "1"} in spec["containers"][0]["env"]


def test_spark_pipelines_get_the_spark_worker_image() -> None:
    """Only the worker-spark image has pyspark and a JRE; spec.image still wins."""
    config = OperatorConfig(
        worker_image="registry.test/offtake-worker:1", worker_spark_image="registry.test/ws:1"
    )
    spark = {"spark": {"format": "parquet", "path": "/data/out"}}
    for body, image in [
        (pipeline_body(), "registry.test/offtake-worker:1"),
        (pipeline_body(sink=spark), "registry.test/ws:1"),
        (pipeline_body(sink=spark, image="mine:7"), "mine:7"),
    ]:
        dep = render.render_deployment(body, parsed(body), config, replicas=1)
        (worker,) = dep["spec"]["template"]["spec"]["containers"]
        assert worker["image"] == image
