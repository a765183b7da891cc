"""submit.mode kubernetes: the rendered SparkApplication fits the spark-operator's CRD schema
(a minimal copy in fixtures/), and the spark-submit command targets a k8s:// master."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from offtake.sinks.spark.kubernetes import (
    CONNECT_CLASS,
    KubernetesRenderError,
    connect_url,
    crd_schema,
    render_connect_service,
    render_spark_application,
    spark_submit_command,
    validate,
)
from offtake.sinks.spark.session import SparkSessionError, session_config

from .support import pipeline

CRD = yaml.safe_load((Path(__file__).parent / "fixtures" / "sparkapplication-crd.yaml").read_text())
SCHEMA = crd_schema(CRD)


def _spec(**submit: Any) -> Any:
    return pipeline(
        {
            "format": "delta",
            "path": "s3a://lake/orders",
            "packages": ["org.apache.hadoop:hadoop-aws:3.4.1"],
            "submit": {
                "mode": "kubernetes",
                "master": "k8s://https://kubernetes.default.svc",
                "conf": {
                    "spark.kubernetes.container.image": "registry/spark:4.3.0",
                    "spark.hadoop.fs.s3a.endpoint": "http://minio:9000",
                },
                **submit,
            },
        },
        name="orders-lake",
    )


def test_rendered_spark_application_validates_against_the_crd() -> None:
    app = render_spark_application(_spec(), version="4.3.0")
    assert validate(app, SCHEMA) == []
    spec = app["spec"]
    assert spec["mainClass"] == CONNECT_CLASS and spec["type"] == "Scala"
    assert spec["image"] == "registry/spark:4.3.0"
    assert "spark.kubernetes.container.image" not in spec["sparkConf"]
    assert spec["sparkConf"]["spark.hadoop.fs.s3a.endpoint"] == "http://minio:9000"
    assert spec["sparkConf"]["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert "org.apache.hadoop:hadoop-aws:3.4.1" in spec["deps"]["packages"]
    assert any(p.startswith("io.delta:delta-spark_2.13:") for p in spec["deps"]["packages"])
    assert app["metadata"]["namespace"] == "test"


def test_validation_names_the_bad_field() -> None:
    app = render_spark_application(_spec(), version="4.3.0")
    bad = copy.deepcopy(app)
    bad["spec"]["type"] = "Go"
    bad["spec"]["executor"]["instances"] = 0
    bad["spec"]["driver"]["cores"] = "1"
    del bad["spec"]["sparkVersion"]
    bad["spec"]["sparkConf"]["x"] = 1
    bad["spec"]["executor"]["gpu"] = True
    errors = validate(bad, SCHEMA)
    assert "spec.type: 'Go' is not one of ['Java', 'Python', 'Scala', 'R']" in errors
    assert "spec.executor.instances: 0 is below the minimum 1" in errors
    assert "spec.driver.cores: expected integer, got str" in errors
    assert "spec.sparkVersion: required" in errors
    assert "spec.sparkConf.x: expected string, got int" in errors
    assert "spec.executor.gpu: unknown field" in errors


def test_service_and_connect_url_match_the_driver() -> None:
    spec = _spec()
    app = render_spark_application(spec, version="4.3.0")
    svc = render_connect_service(spec)
    assert svc["spec"]["selector"]["offtake.dev/pipeline"] == "orders-lake"
    assert set(svc["spec"]["selector"]).issuperset(app["spec"]["driver"]["labels"])
    assert connect_url(spec) == "sc://orders-lake-spark-connect.test:15002"
    assert connect_url(_spec(connectUrl="sc://elsewhere:15002")) == "sc://elsewhere:15002"


def test_spark_submit_command_for_a_k8s_master() -> None:
    cmd = spark_submit_command(_spec(), version="4.3.0")
    assert cmd[:6] == [
        "spark-submit",
        "--master",
        "k8s://https://kubernetes.default.svc",
        "--deploy-mode",
        "cluster",
        "--name",
    ]
    assert "--class" in cmd and CONNECT_CLASS in cmd
    assert "spark.kubernetes.container.image=registry/spark:4.3.0" in cmd
    assert "spark.connect.grpc.binding.port=15002" in cmd
    assert cmd[-1] == "local:///opt/spark/jars/spark-connect_2.13-4.3.0.jar"
    with pytest.raises(KubernetesRenderError, match=r"sink\.spark\.submit\.master"):
        spark_submit_command(_spec(master="local[*]"))


def test_submit_fields_are_checked_with_their_names() -> None:
    with pytest.raises(SparkSessionError, match=r"sink.spark.submit.master"):
        session_config(_spec(master="local[2]").sink.spark)
    cfg = session_config(_spec(connectUrl="sc://x:15002").sink.spark)
    assert cfg.remote
    bad = pipeline({"format": "parquet", "path": "/x", "packages": ["not-a-coordinate"]})
    with pytest.raises(SparkSessionError, match=r"sink.spark.packages\[0\]"):
        session_config(bad.sink.spark)
