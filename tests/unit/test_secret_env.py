"""The worker's side of ``*SecretRef: {name, key}``: each value is read from the environment
variable the operator fills from the Secret, and only where it is used."""

from __future__ import annotations

from typing import Any

import pytest
from support.manifest_corpus import minimal

from offtake.config import ConfigError, parse_pipeline
from offtake.config.secret_env import (
    ICEBERG_PASSWORD_ENV,
    JDBC_PASSWORD_ENV,
    SPARK_CONNECT_TOKEN_ENV,
)
from offtake.config.spec import SparkSinkSpec
from offtake.sinks.spark.iceberg import catalog_uri
from offtake.sinks.spark.jdbc import credentials
from offtake.sinks.spark.session import session_config, with_token


def spark(sink: dict[str, Any]) -> SparkSinkSpec:
    doc = minimal()
    doc["spec"]["sink"] = {"spark": sink}
    out = parse_pipeline(doc).sink.spark
    assert out is not None
    return out


JDBC = {
    "format": "jdbc",
    "jdbc": {
        "url": "jdbc:postgresql://db:5432/shop",
        "table": "orders",
        "user": "writer",
        "passwordSecretRef": {"name": "shop-db", "key": "password"},
    },
}


def test_the_jdbc_password_comes_from_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    jdbc = spark(JDBC).jdbc
    assert jdbc is not None
    monkeypatch.setenv(JDBC_PASSWORD_ENV, "s3cret\n")  # as a Secret made with echo
    assert credentials(jdbc)["password"] == "s3cret"
    assert credentials(jdbc)["user"] == "writer"
    monkeypatch.delenv(JDBC_PASSWORD_ENV)
    with pytest.raises(ConfigError, match=r"sink\.spark\.jdbc\.passwordSecretRef: \$OFFTAKE_JDBC"):
        credentials(jdbc)


def test_the_iceberg_password_is_put_into_the_catalog_uri(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    iceberg = {
        "table": "lake.orders",
        "catalogUri": "postgresql+psycopg://iceberg@db:5432/catalog",
        "passwordSecretRef": {"name": "catalog", "key": "password"},
    }
    spec = spark({"format": "iceberg", "path": "/lake", "iceberg": iceberg}).iceberg
    assert spec is not None and "p%40ss" not in spec.catalog_uri
    monkeypatch.setenv(ICEBERG_PASSWORD_ENV, "p@ss/word")
    # Escaped as a URL needs it: a password with @ or / must not change the host.
    assert catalog_uri(spec) == "postgresql+psycopg://iceberg:p%40ss%2Fword@db:5432/catalog"


def test_the_connect_token_is_added_only_where_the_channel_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    submit = {
        "mode": "connect",
        "connectUrl": "sc://spark:15002/;use_ssl=true",
        "tokenSecretRef": {"name": "spark", "key": "token"},
    }
    cfg = session_config(spark({"format": "json", "path": "/out", "submit": submit}))
    monkeypatch.setenv(SPARK_CONNECT_TOKEN_ENV, "t0ken")
    # connect_url is what the worker logs ("connecting to Spark Connect at ..."): no token.
    assert cfg.connect_url == "sc://spark:15002/;use_ssl=true"
    assert (
        with_token(cfg.connect_url, cfg.token_env) == "sc://spark:15002/;use_ssl=true;token=t0ken"
    )
    assert with_token("sc://spark:15002", cfg.token_env) == "sc://spark:15002/;token=t0ken"
    assert with_token("sc://spark:15002", None) == "sc://spark:15002"
