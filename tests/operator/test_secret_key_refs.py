"""``*SecretRef: {name, key}`` fields reach the worker as environment variables from their
Secret (``valueFrom.secretKeyRef``): the value is in neither the ConfigMap nor the pod spec."""

from __future__ import annotations

from typing import Any

import yaml
from operator_testkit import pipeline_body

from offtake.config import parse_pipeline
from offtake.config.secret_env import (
    ICEBERG_PASSWORD_ENV,
    JDBC_PASSWORD_ENV,
    SPARK_CONNECT_TOKEN_ENV,
)
from offtake_operator import render
from offtake_operator.reconcile import worker_manifest
from offtake_operator.settings import OperatorConfig

CONFIG = OperatorConfig(worker_image="registry.test/offtake:1.2.3")


def rendered(sink: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(the worker container, the ConfigMap's pipeline.yaml) of a pipeline with ``sink``."""
    body = pipeline_body(sink=sink)
    pipeline = parse_pipeline(worker_manifest(body))
    deployment = render.render_deployment(body, pipeline, CONFIG, replicas=1)
    (worker,) = deployment["spec"]["template"]["spec"]["containers"]
    configmap = render.render_configmap(body)
    return worker, configmap["data"]["pipeline.yaml"]


def env_from_secret(worker: dict[str, Any], variable: str) -> dict[str, Any]:
    (entry,) = [e for e in worker["env"] if e["name"] == variable]
    assert "value" not in entry, "a secret's value must not be in the pod spec"
    ref: dict[str, Any] = entry["valueFrom"]["secretKeyRef"]
    return ref


def test_a_jdbc_password_secret_ref_becomes_a_secret_key_env_and_stays_out_of_the_configmap() -> (
    None
):
    jdbc = {
        "url": "jdbc:postgresql://db:5432/shop",
        "table": "orders",
        "user": "writer",
        "passwordSecretRef": {"name": "shop-db", "key": "password"},
    }
    worker, text = rendered({"spark": {"format": "jdbc", "jdbc": jdbc}})
    assert env_from_secret(worker, JDBC_PASSWORD_ENV) == {"name": "shop-db", "key": "password"}
    stored = yaml.safe_load(text)["spec"]["sink"]["spark"]["jdbc"]
    assert "password" not in stored
    assert stored["passwordSecretRef"] == {"name": "shop-db", "key": "password"}


def test_the_iceberg_password_and_the_connect_token_come_from_their_secrets() -> None:
    iceberg = {
        "table": "lake.orders",
        "catalogUri": "postgresql+psycopg://iceberg@db:5432/catalog",
        "passwordSecretRef": {"name": "catalog", "key": "pw"},
    }
    submit = {
        "mode": "connect",
        "connectUrl": "sc://spark:15002",
        "tokenSecretRef": {"name": "spark", "key": "token"},
    }
    sink = {"spark": {"format": "iceberg", "path": "/lake", "iceberg": iceberg, "submit": submit}}
    worker, text = rendered(sink)
    assert env_from_secret(worker, ICEBERG_PASSWORD_ENV) == {"name": "catalog", "key": "pw"}
    assert env_from_secret(worker, SPARK_CONNECT_TOKEN_ENV) == {"name": "spark", "key": "token"}
    assert "token=" not in text and ":pw@" not in text


def test_no_secret_env_without_secret_refs() -> None:
    worker, _ = rendered({"log": {}})
    names = {e["name"] for e in worker["env"]}
    assert not names & {JDBC_PASSWORD_ENV, ICEBERG_PASSWORD_ENV, SPARK_CONNECT_TOKEN_ENV}
