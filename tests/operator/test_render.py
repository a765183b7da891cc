"""The pure rendering of a ConsumerPipeline into its children."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from operator_testkit import example, pipeline_body

from offtake.config import load_pipeline, parse_pipeline
from offtake_operator import names, render
from offtake_operator.operator_spec import parse_operator_spec
from offtake_operator.reconcile import worker_manifest
from offtake_operator.settings import OperatorConfig

CONFIG = OperatorConfig(worker_image="registry.test/offtake:1.2.3")


def parsed(body: dict[str, Any]) -> Any:
    return parse_pipeline(worker_manifest(body))


def deployment(body: dict[str, Any], replicas: int | None = None) -> dict[str, Any]:
    p = parsed(body)
    return render.render_deployment(
        body, p, CONFIG, replicas=p.replicas if replicas is None else replicas
    )


def pod_spec(body: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment(body)["spec"]["template"]["spec"]
    return spec


def test_configmap_holds_a_manifest_the_worker_loads(tmp_path: Any) -> None:
    body = example("kafka-to-kafka.yaml")
    cm = render.render_configmap(body)
    assert cm["metadata"]["name"] == "orders-enrich-pipeline"
    text = cm["data"]["pipeline.yaml"]
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    loaded = load_pipeline(path)
    assert loaded.name == "orders-enrich" and loaded.namespace == "shop"
    assert loaded.processor.function == "offtake_examples.enrich:handle"
    assert loaded.sink.kafka is not None and loaded.sink.kafka.topic == "orders-enriched"
    doc = yaml.safe_load(text)
    assert doc["apiVersion"] == "offtake.dev/v1alpha1" and doc["kind"] == "ConsumerPipeline"
    # Deployment-level fields stay out, so scaling does not roll the pods.
    assert "replicas" not in doc["spec"] and "paused" not in doc["spec"]


def test_every_child_is_owned_and_labelled() -> None:
    body = example("sidecar.yaml")
    p = parsed(body)
    scaling = parse_operator_spec({"autoscaling": {"enabled": True}}).autoscaling
    children = [
        render.render_configmap(body),
        render.render_deployment(body, p, CONFIG, replicas=3),
        render.render_service(body, p),
        render.render_pdb(body),
        render.render_service_monitor(body),
        render.render_hpa(body, scaling, None),
        render.render_scaled_object(body, p, scaling, None),
    ]
    for child in children:
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref == {
            "apiVersion": "offtake.dev/v1alpha1",
            "kind": "ConsumerPipeline",
            "name": "orders-score",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert child["metadata"]["namespace"] == "shop"
        assert child["metadata"]["labels"][names.PIPELINE_LABEL] == "orders-score"


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


def test_config_changes_change_the_checksum_but_scaling_does_not() -> None:
    def checksum(body: dict[str, Any]) -> str:
        value: str = deployment(body)["spec"]["template"]["metadata"]["annotations"][
            names.CHECKSUM_ANNOTATION
        ]
        return value

    base = pipeline_body()
    assert checksum(base) == checksum(pipeline_body())
    assert checksum(pipeline_body(replicas=5)) == checksum(base)
    assert checksum(pipeline_body(paused=True)) == checksum(base)
    assert checksum(pipeline_body(commit={"intervalSeconds": 5})) != checksum(base)
    assert checksum(pipeline_body(source={"topics": ["other"]})) != checksum(base)


def test_paused_and_rewinding_run_no_workers() -> None:
    assert render.desired_worker_replicas(parsed(pipeline_body(replicas=3)), rewinding=False) == 3
    assert (
        render.desired_worker_replicas(
            parsed(pipeline_body(replicas=3, paused=True)), rewinding=False
        )
        == 0
    )
    assert render.desired_worker_replicas(parsed(pipeline_body(replicas=3)), rewinding=True) == 0


def test_sidecar_runs_as_a_native_sidecar_that_outlives_the_worker() -> None:
    body = example("sidecar.yaml")
    spec = pod_spec(body)
    (sidecar,) = spec["initContainers"]
    # restartPolicy Always on an init container = a native sidecar: started before the
    # worker, stopped after it, so the draining worker can still reach it.
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["image"] == "registry.example.com/orders-scorer:1.4"
    assert sidecar["ports"] == [{"name": "processor", "containerPort": 8080, "protocol": "TCP"}]
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "processor"}
    assert sidecar["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "processor"}
    assert sidecar["env"] == [{"name": "MODEL", "value": "gradient-boost-v3"}]
    assert sidecar["resources"]["requests"] == {"cpu": "250m", "memory": "256Mi"}
    # The Kafka secret is mounted where the worker reads it.
    (worker,) = spec["containers"]
    assert {
        "name": "kafka-secret",
        "mountPath": "/etc/offtake/kafka-secret",
        "readOnly": True,
    } in worker["volumeMounts"]
    assert {"name": "kafka-secret", "secret": {"secretName": "kafka-credentials"}} in spec[
        "volumes"
    ]


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


def test_service_and_pdb() -> None:
    body = pipeline_body(metrics={"port": 9300})
    svc = render.render_service(body, parsed(body))
    assert svc["metadata"]["name"] == "orders-metrics"
    assert svc["spec"]["selector"] == {"offtake.dev/pipeline": "orders"}
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": 9300, "targetPort": "metrics", "protocol": "TCP"}
    ]
    pdb = render.render_pdb(body)
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": {"offtake.dev/pipeline": "orders"}},
    }


@pytest.mark.parametrize(("partitions", "expected"), [(None, (2, 10)), (6, (2, 6)), (1, (1, 1))])
def test_autoscalers_never_exceed_the_partition_count(
    partitions: int | None, expected: tuple[int, int]
) -> None:
    body = pipeline_body(source={"topics": ["orders"], "groupId": "g1"})
    scaling = parse_operator_spec(
        {"autoscaling": {"enabled": True, "minReplicas": 2, "targetLagPerReplica": 500}}
    ).autoscaling
    hpa = render.render_hpa(body, scaling, partitions)
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == expected
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "name": "orders",
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "offtake_consumer_lag_messages"
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "500"}
    so = render.render_scaled_object(body, parsed(body), scaling, partitions)
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == expected
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "kafka"
    assert trigger["metadata"] == {
        "bootstrapServers": "kafka:9092",
        "consumerGroup": "g1",
        "lagThreshold": "500",
        "offsetResetPolicy": "earliest",
        "topic": "orders",
    }


def test_lag_seconds_scale_an_hpa_on_the_external_metric_with_a_stabilised_scale_down() -> None:
    body = pipeline_body(source={"topics": ["orders"], "groupId": "g1"})
    scaling = parse_operator_spec(
        {
            "autoscaling": {
                "enabled": True,
                "maxReplicas": 8,
                "targetLagSeconds": 30,
                "scaleDownStabilizationSeconds": 45,
            }
        }
    ).autoscaling
    hpa = render.render_hpa(body, scaling, 4)
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
    assert hpa["spec"]["metrics"] == [
        {
            "type": "External",
            "external": {
                "metric": {
                    "name": "offtake_consumer_lag_seconds",
                    "selector": {"matchLabels": {"pipeline": "orders"}},
                },
                "target": {"type": "Value", "value": "30"},
            },
        }
    ]
    assert hpa["spec"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 45}}
    # Without a Prometheus address KEDA cannot ask for seconds: the HPA is the one rendered.
    assert not render.uses_scaled_object(scaling, keda_served=True)
    assert not render.uses_scaled_object(scaling, keda_served=False)


def test_lag_seconds_with_keda_use_its_prometheus_scaler() -> None:
    body = pipeline_body(source={"topics": ["orders"], "groupId": "g1"})
    scaling = parse_operator_spec(
        {
            "autoscaling": {
                "enabled": True,
                "minReplicas": 0,
                "targetLagSeconds": 20,
                "prometheusAddress": "http://prometheus.monitoring:9090",
            }
        }
    ).autoscaling
    assert render.uses_scaled_object(scaling, keda_served=True)
    so = render.render_scaled_object(body, parsed(body), scaling, 6)
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (0, 6)
    assert so["spec"]["cooldownPeriod"] == 300
    assert so["spec"]["advanced"] == {
        "horizontalPodAutoscalerConfig": {
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}}
        }
    }
    (trigger,) = so["spec"]["triggers"]
    assert trigger == {
        "type": "prometheus",
        "metricType": "Value",
        "metadata": {
            "serverAddress": "http://prometheus.monitoring:9090",
            "query": 'max(offtake_consumer_lag_seconds{namespace="shop", pipeline="orders"})',
            "threshold": "20",
            "ignoreNullValues": "true",
        },
    }


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


def test_spark_jdbc_secret_is_mounted() -> None:
    body = pipeline_body(
        sink={
            "spark": {
                "format": "jdbc",
                "jdbc": {
                    "url": "jdbc:postgresql://db/x",
                    "table": "t",
                    "secretRef": {"name": "db"},
                },
            }
        }
    )
    spec = pod_spec(body)
    assert {"name": "jdbc-secret", "secret": {"secretName": "db"}} in spec["volumes"]
    assert any(
        m["mountPath"] == names.JDBC_SECRET_DIR for m in spec["containers"][0]["volumeMounts"]
    )


def test_service_monitor_labels_series_as_the_dashboards_expect() -> None:
    sm = render.render_service_monitor(pipeline_body())
    assert sm["spec"]["selector"]["matchLabels"] == {
        "offtake.dev/pipeline": "orders",
        "offtake.dev/component": "metrics",
    }
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
    assert relabel["job"]["replacement"] == "offtake"
    assert relabel["pipeline"]["sourceLabels"] == [
        "__meta_kubernetes_pod_label_offtake_dev_pipeline"
    ]
    svc = render.render_service(pipeline_body(), parsed(pipeline_body()))
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()


def test_schema_registry_secrets_are_mounted_one_folder_each() -> None:
    registry = {"url": "https://registry:8081", "secretRef": {"name": "sr-read"}}
    body = pipeline_body(
        source={"topics": ["orders"], "format": "avro", "schemaRegistry": registry},
        sink={
            "kafka": {
                "topic": "out",
                "format": "avro",
                "schema": {"subject": "out-value"},
                "schemaRegistry": {**registry, "secretRef": {"name": "sr-write"}},
            }
        },
    )
    spec = pod_spec(body)
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    for secret in ("sr-read", "sr-write"):
        name = mounts[f"{names.SCHEMA_REGISTRY_SECRETS_DIR}/{secret}"]
        assert volumes[name]["secret"] == {"secretName": secret}
