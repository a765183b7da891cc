"""Good and bad ConsumerPipeline manifests, for `offtake validate` and the API server alike."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def minimal(name: str = "p") -> dict[str, Any]:
    return {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": name},
        "spec": {
            "kafka": {"bootstrapServers": "kafka:9092"},
            "source": {"topics": ["orders"]},
            "sink": {"log": {}},
        },
    }


def one_replica(name: str) -> dict[str, Any]:
    """``minimal`` with ``replicas: 1``: a pipeline the operator scales (its e2e and chaos
    tests apply hundreds of them)."""
    doc = minimal(name)
    doc["spec"]["replicas"] = 1
    return doc


def _with(spec_changes: dict[str, Any], name: str = "p") -> dict[str, Any]:
    doc = minimal(name)
    doc["spec"].update(copy.deepcopy(spec_changes))
    return doc


def corpus() -> list[tuple[str, dict[str, Any]]]:
    """(case id, manifest); each bad case breaks the CRD in one way."""
    good = [
        (f"example-{p.stem}", yaml.safe_load(p.read_text()))
        for p in sorted((ROOT / "examples").glob("*.yaml"))
    ]
    good.append(("minimal", minimal()))
    good.append(("dlq-with-topic", _with({"errors": {"policy": "dlq", "dlq": {"topic": "d"}}})))
    good.append(
        (
            "retry-topics",
            _with({"errors": {"retryTopics": [{"delaySeconds": 10}, {"delaySeconds": 60}]}}),
        )
    )
    good.append(("strict-ordering", _with({"errors": {"ordering": "strict"}})))
    good.append(("jdbc-password-secret-ref", _with({"sink": {"spark": _JDBC_FROM_SECRET}})))
    good.append(("share-fetch-tuning", _share_config({"fetch.max.bytes": "1048576"})))
    bad_client = [
        ("kafka-config-plugin", _kafka_config({"plugin.library.paths": "/tmp/evil.so"})),
        ("kafka-config-kinit", _kafka_config({"sasl.kerberos.kinit.cmd": "touch /tmp/x"})),
        ("kafka-config-principal-shell", _kafka_config({"sasl.kerberos.principal": "a;id"})),
        ("sink-config-engine", _sink_config({"ssl.engine.location": "/tmp/evil.so"})),
        ("sink-config-secret", _sink_config({"sasl.password": "hunter2"})),
        ("jdbc-inline-password", _with({"sink": {"spark": _JDBC_INLINE}})),
        ("iceberg-uri-password", _with({"sink": {"spark": _ICEBERG_INLINE}})),
        ("connect-url-token", _with({"sink": {"spark": _CONNECT_INLINE}})),
        ("spark-conf-secret", _with({"sink": {"spark": _SPARK_CONF_SECRET}})),
        ("share-session-timeout", _share_config({"session.timeout.ms": 6000})),
        ("share-auto-offset-reset", _share_config({"auto.offset.reset": "earliest"})),
    ]
    bad = [
        ("name-too-long", minimal("p" * 56)),
        ("name-not-a-dns-label", minimal("9lives")),
        ("no-topics", _with({"source": {}})),
        ("topics-not-a-list", _with({"source": {"topics": "orders"}})),
        ("two-sinks", _with({"sink": {"log": {}, "kafka": {"topic": "t"}}})),
        ("no-sink", _with({"sink": {}})),
        (
            "function-and-container",
            _with({"processor": {"function": "a:b", "container": {"image": "i"}}}),
        ),
        ("dlq-without-topic", _with({"errors": {"policy": "dlq"}})),
        ("unknown-policy", _with({"errors": {"policy": "retry-forever"}})),
        (
            "retry-topics-with-strict-ordering",
            _with({"errors": {"retryTopics": [{"delaySeconds": 10}], "ordering": "strict"}}),
        ),
        (
            "retry-topics-duplicate-delay",
            _with({"errors": {"retryTopics": [{"delaySeconds": 10}, {"delaySeconds": 10}]}}),
        ),
        ("in-flight-not-a-number", _with({"limits": {"maxInFlightMessages": "lots"}})),
        (
            "connect-timeout-zero",
            _with({"kafka": {"bootstrapServers": "k:9092", "connectTimeoutSeconds": 0}}),
        ),
        ("spark-jdbc-without-jdbc", _with({"sink": {"spark": {"format": "jdbc"}}})),
        ("spark-file-without-path", _with({"sink": {"spark": {"format": "parquet"}}})),
    ]
    return [*good, *bad, *bad_client]


_JDBC_FROM_SECRET = {
    "format": "jdbc",
    "jdbc": {
        "url": "jdbc:postgresql://db:5432/shop",
        "table": "orders",
        "user": "writer",
        "passwordSecretRef": {"name": "shop-db", "key": "password"},
    },
}
_JDBC_INLINE = {
    "format": "jdbc",
    "jdbc": {"url": "jdbc:postgresql://db/shop", "table": "orders", "password": "hunter2"},
}
_ICEBERG_INLINE = {
    "format": "iceberg",
    "path": "/lake",
    "iceberg": {"table": "lake.orders", "catalogUri": "postgresql://ice:hunter2@db/catalog"},
}
_CONNECT_INLINE = {
    "format": "json",
    "path": "/out",
    "submit": {"mode": "connect", "connectUrl": "sc://spark:15002/;token=hunter2"},
}
_SPARK_CONF_SECRET = {
    "format": "json",
    "path": "/out",
    "submit": {"conf": {"spark.hadoop.fs.s3a.secret.key": "hunter2"}},
}


def _kafka_config(config: dict[str, Any]) -> dict[str, Any]:
    return _with({"kafka": {"bootstrapServers": "kafka:9092", "config": config}})


def _share_config(config: dict[str, Any]) -> dict[str, Any]:
    """Queue mode with kafka.config: what a share consumer refuses or ignores is refused."""
    return _with(
        {
            "kafka": {"bootstrapServers": "kafka:9092", "config": config},
            "source": {"topics": ["jobs"], "groupType": "share"},
        }
    )


def _sink_config(config: dict[str, Any]) -> dict[str, Any]:
    return _with({"sink": {"kafka": {"topic": "out", "config": config}}})


GOOD = {case for case, _ in corpus() if case.startswith("example-")} | {
    "minimal",
    "dlq-with-topic",
    "retry-topics",
    "strict-ordering",
    "jdbc-password-secret-ref",
    "share-fetch-tuning",
}

#: What the API server's refusal must name (a rule's messageExpression: the refused key).
NAMED = {
    "kafka-config-plugin": '"plugin.library.paths" is refused',
    "kafka-config-kinit": '"sasl.kerberos.kinit.cmd" is refused',
    "sink-config-engine": '"ssl.engine.location" is refused',
    "sink-config-secret": '"sasl.password" is a secret',
    "spark-conf-secret": '"spark.hadoop.fs.s3a.secret.key" looks like a secret',
    "jdbc-inline-password": "jdbc.passwordSecretRef",
    "share-session-timeout": 'kafka.config["session.timeout.ms"] cannot be set with '
    "source.groupType share: a share consumer refuses it (queue mode); instead: sessions are "
    "timed by the group config share.session.timeout.ms",
    "share-auto-offset-reset": 'kafka.config["auto.offset.reset"] cannot be set with '
    "source.groupType share: a share consumer refuses it (queue mode); instead: "
    "spec.source.startFrom",
}
