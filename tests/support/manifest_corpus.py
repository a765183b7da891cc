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
    return [*good, *bad]


GOOD = {case for case, _ in corpus() if case.startswith("example-")} | {
    "minimal",
    "dlq-with-topic",
    "retry-topics",
    "strict-ordering",
}
