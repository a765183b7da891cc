"""submit.mode kubernetes without a cluster: the SparkConnect spec rendered from the submit
fields, the workers' URL, and the fields' errors. tests/e2e/test_operator_spark_connect.py
applies it to a real API server with the Kubeflow Spark operator's CRD."""

from __future__ import annotations

import json
from typing import Any

import pytest

from offtake.config import ConfigError
from offtake.sinks.spark.kubernetes import (
    SPARK_VERSION,
    USE_DRIVER_POD_IP,
    kubernetes_connect_url,
    render_spark_connect_spec,
)
from offtake.sinks.spark.session import SparkSessionError, session_config, spark_version

from .support import pipeline


def _spec(**submit: Any) -> Any:
    return pipeline(
        {
            "format": "delta",
            "path": "s3a://lake/orders",
            "packages": ["org.apache.hadoop:hadoop-aws:3.4.1"],
            "submit": {
                "mode": "kubernetes",
                "conf": {"spark.hadoop.fs.s3a.endpoint": "http://minio:9000"},
                **submit,
            },
        },
        name="orders-lake",
    )


def test_spark_connect_spec_carries_every_submit_field() -> None:
    spec = render_spark_connect_spec(
        _spec(
            image="registry/spark:4.3.0",
            serviceAccount="spark",
            server={"cores": 2, "memory": "4g"},
            executors={"instances": 3, "cores": 2, "memory": "8g"},
        )
    )
    assert spec["image"] == "registry/spark:4.3.0"
    assert spec["sparkVersion"] == SPARK_VERSION
    server, executor = spec["server"], spec["executor"]
    assert (server["cores"], server["memory"]) == (2, "4g")
    assert (executor["instances"], executor["cores"], executor["memory"]) == (3, 2, "8g")
    for part in (server, executor):
        assert part["template"]["spec"]["serviceAccountName"] == "spark"
    conf = spec["sparkConf"]
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://minio:9000"
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    packages = conf["spark.jars.packages"].split(",")
    assert "org.apache.hadoop:hadoop-aws:3.4.1" in packages
    assert any(p.startswith("io.delta:delta-spark_2.13:") for p in packages)
    assert all(isinstance(v, str) for v in conf.values())  # the CRD's sparkConf is string-valued


def test_executors_reach_the_server_at_its_pod_ip_not_its_bind_address() -> None:
    # The Spark operator starts the server with spark.driver.bindAddress=0.0.0.0 and
    # spark.driver.host=<pod IP>; Spark >= 4.1 gives executors the bind address unless told
    # otherwise, and they dial 0.0.0.0 (tests/node/test_spark_on_kubernetes.py runs it).
    conf = render_spark_connect_spec(_spec())["sparkConf"]
    assert conf[USE_DRIVER_POD_IP] == "false"


def test_defaults_and_the_server_spark_matches_the_workers() -> None:
    spec = render_spark_connect_spec(_spec())
    assert spec["image"] == f"apache/spark:{SPARK_VERSION}"
    assert (spec["server"]["cores"], spec["server"]["memory"]) == (1, "2g")
    assert [spec["executor"][k] for k in ("instances", "cores", "memory")] == [2, 1, "2g"]
    assert "serviceAccountName" not in spec["server"]["template"]["spec"]
    # A Spark Connect client talks to a server of its own Spark version.
    assert spark_version() == SPARK_VERSION


def test_worker_connects_to_the_operators_server(monkeypatch: pytest.MonkeyPatch) -> None:
    spark = _spec().sink.spark
    monkeypatch.delenv("OFFTAKE_SPARK_CONNECT_URL", raising=False)
    cfg = session_config(spark, "orders-lake", "shop")
    assert cfg.remote
    assert cfg.connect_url == "sc://orders-lake-spark-server.shop.svc:15002"
    assert cfg.connect_url == kubernetes_connect_url("orders-lake", "shop")
    monkeypatch.setenv("OFFTAKE_SPARK_CONNECT_URL", "sc://127.0.0.1:15999")
    assert session_config(spark, "orders-lake", "shop").connect_url == "sc://127.0.0.1:15999"
    monkeypatch.setenv("OFFTAKE_SPARK_CONNECT_URL", "http://x")
    with pytest.raises(SparkSessionError, match="OFFTAKE_SPARK_CONNECT_URL"):
        session_config(spark, "orders-lake", "shop")


@pytest.mark.parametrize(
    ("submit", "field", "message"),
    [
        ({"mode": "local", "image": "x"}, "submit.image", "only used when mode is kubernetes"),
        ({"mode": "connect", "connectUrl": "sc://x:1", "server": {}}, "submit.server", "only"),
        ({"mode": "kubernetes", "connectUrl": "sc://x:1"}, "submit.connectUrl", "not used"),
        ({"mode": "kubernetes", "server": {"memory": "lots"}}, "server.memory", "memory size"),
        ({"mode": "kubernetes", "executors": {"instances": -1}}, "executors.instances", ""),
        ({"mode": "kubernetes", "sparkApplication": {}}, "submit.sparkApplication", ""),
    ],
)
def test_submit_fields_are_checked_with_their_names(
    submit: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        pipeline({"format": "parquet", "path": "/x", "submit": submit})
    assert field in str(err.value) and message in str(err.value)


def test_packages_are_checked_with_their_names() -> None:
    bad = pipeline({"format": "parquet", "path": "/x", "packages": ["not-a-coordinate"]})
    assert bad.sink.spark is not None
    with pytest.raises(SparkSessionError, match=r"sink.spark.packages\[0\]"):
        session_config(bad.sink.spark)


def test_spark_pods_are_restricted_and_the_server_reads_the_token_from_its_secret() -> None:
    from offtake_operator.security import check_container, check_pod

    spec = render_spark_connect_spec(_spec())
    server, executor = spec["server"]["template"], spec["executor"]["template"]
    for role, template in (("server", server), ("executor", executor)):
        # Not the pipeline label (the workers' Deployment and Service select by it).
        assert template["metadata"]["labels"] == {
            "offtake.dev/spark-connect": "orders-lake",
            "offtake.dev/spark-role": role,
        }
        pod = template["spec"]["securityContext"]
        check_pod(pod, role)  # Pod Security restricted, or ConfigError naming the field
        (container,) = template["spec"]["containers"]
        check_container(container["securityContext"], pod, role)
        assert pod["runAsUser"] == 185  # the apache/spark image's user
    assert server["spec"]["containers"][0]["name"] == "spark-kubernetes-driver"
    assert server["spec"]["containers"][0]["env"] == [
        {
            "name": "SPARK_CONNECT_AUTHENTICATE_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "orders-lake-spark-token", "key": "token"}},
        }
    ]
    assert executor["spec"]["automountServiceAccountToken"] is False
    assert "token" not in json.dumps(spec["sparkConf"]).lower()


@pytest.mark.parametrize(
    "key",
    [
        "spark.kubernetes.driver.volumes.hostPath.root.mount.path",
        "spark.kubernetes.executor.volumes.hostPath.root.options.path",
        "spark.kubernetes.executor.volumes.persistentVolumeClaim.data.options.claimName",
        "spark.kubernetes.executor.podTemplateFile",
        "spark.kubernetes.driver.podTemplateFile",
        "spark.kubernetes.authenticate.driver.serviceAccountName",
        "spark.kubernetes.authenticate.oauthTokenFile",
        "spark.kubernetes.container.image.pullSecrets",
        "spark.kubernetes.namespace",
        "spark.kubernetes.node.selector.kubernetes.io/hostname",
        "Spark.Kubernetes.Executor.PodTemplateFile",
        "spark.connect.authenticate.token",
        "spark.connect.grpc.binding.port",
        "spark.master",
    ],
)
@pytest.mark.parametrize("mode", ["kubernetes", "local"])
def test_submit_conf_keys_that_would_escape_are_refused_by_name(key: str, mode: str) -> None:
    with pytest.raises(ConfigError) as err:
        pipeline({"format": "parquet", "path": "/x", "submit": {"mode": mode, "conf": {key: "x"}}})
    assert f"sink.spark.submit.conf[{json.dumps(key)}]" in str(err.value), str(err.value)


def test_submit_conf_sizing_and_java_options_pass() -> None:
    conf = {
        "spark.kubernetes.executor.request.cores": "500m",
        "spark.kubernetes.memoryOverheadFactor": "0.2",
        "spark.driver.extraJavaOptions": "-Dx=1",
        "spark.sql.shuffle.partitions": "4",
    }
    spec = pipeline(
        {"format": "parquet", "path": "/x", "submit": {"mode": "kubernetes", "conf": conf}}
    )
    assert spec.sink.spark is not None and spec.sink.spark.submit.conf == conf
