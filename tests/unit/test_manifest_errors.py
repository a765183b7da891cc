"""Malformed manifests: exit code 2 and a message naming the field and what was expected."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from offtake.config import ConfigError, parse_pipeline

GOOD: dict[str, Any] = {
    "apiVersion": "offtake.dev/v1alpha1",
    "kind": "ConsumerPipeline",
    "metadata": {"name": "orders", "namespace": "shop"},
    "spec": {
        "kafka": {"bootstrapServers": "kafka:9092"},
        "source": {"topics": ["orders"]},
        "sink": {"kafka": {"topic": "out"}},
    },
}


def with_change(path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node.setdefault(key, {})
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return doc


_DELETE = object()

CASES = [
    ("spec.kafka.bootstrapServers", _DELETE, "spec.kafka.bootstrapServers: is required"),
    ("spec.source.topics", [], "spec.source.topics: expected at least one entry"),
    (
        "spec.source.topics",
        "orders",
        "spec.source.topics: expected a list of strings, got the string 'orders'",
    ),
    (
        "spec.source.format",
        "xml",
        "spec.source.format: expected one of json, string, bytes, avro, protobuf, jsonschema, "
        "got 'xml'",
    ),
    ("spec.source.format", "avro", "spec.source.schemaRegistry: is required when format is avro"),
    (
        "spec.source",
        {"topics": ["t"], "format": "protobuf", "schemaRegistry": {"url": "http://sr:8081"}},
        "spec.source.protobufMessage: is required when format is protobuf",
    ),
    (
        "spec.source",
        {"topics": ["t"], "format": "avro", "schemaRegistry": {"url": "sr:8081"}},
        "spec.source.schemaRegistry.url: expected an http:// or https:// URL, got 'sr:8081'",
    ),
    (
        "spec.source.topics",
        ["^orders\\.(", "b"],
        "spec.source.topics[0]: not a valid regular expression",
    ),
    ("spec.source.startFrom", "middle", "spec.source.startFrom: expected one of earliest, latest"),
    ("spec.limits", {"maxInFlightMesages": 5}, "spec.limits.maxInFlightMesages: unknown field"),
    (
        "spec.limits",
        {"maxInFlightMessages": "lots"},
        "spec.limits.maxInFlightMessages: expected an integer, got the string 'lots'",
    ),
    (
        "spec.limits",
        {"maxInFlightMessages": 0},
        "spec.limits.maxInFlightMessages: expected at least 1, got 0",
    ),
    ("spec.replicas", "two", "spec.replicas: expected an integer, got the string 'two'"),
    ("spec.paused", "yes", "spec.paused: expected true or false"),
    ("spec.commit", {"intervalSeconds": -1}, "spec.commit.intervalSeconds: expected at least 0.01"),
    (
        "spec.sink",
        {"kafka": {"topic": "a"}, "log": {}},
        "spec.sink: expected exactly one of kafka, spark, log; got kafka, log",
    ),
    ("spec.sink", {}, "spec.sink: expected exactly one of kafka, spark, log; got none"),
    ("spec.sink", {"kafka": {}}, "spec.sink.kafka.topic: is required"),
    (
        "spec.sink",
        {"kafka": {"topic": "a", "delivery": "exactly-twice"}},
        "spec.sink.kafka.delivery: expected one of at-least-once, exactly-once, got 'exactly-tw",
    ),
    (
        "spec.processor",
        {"function": "mypkg.enrich"},
        "spec.processor.function: expected module:callable",
    ),
    (
        "spec.processor",
        {"function": "m:f", "container": {"image": "x"}},
        "spec.processor: set either function or container, not both",
    ),
    (
        "spec.processor",
        {"function": "m:f", "concurrency": 0},
        "spec.processor.concurrency: expected at least 1, got 0",
    ),
    (
        "spec.processor",
        {"function": "m:f", "concurrency": 10_001},
        "spec.processor.concurrency: expected at most 10000, got 10001",
    ),
    (
        "spec.processor",
        {"function": "m:f", "order": "offset"},
        "spec.processor.order: expected one of key, partition, none, got 'offset'",
    ),
    (
        "spec.processor",
        {"function": "m:f", "concurrency": 8, "parallelism": 2},
        "spec.processor.concurrency: and spec.processor.parallelism: set one of them above 1",
    ),
    (
        "spec.processor",
        {"function": "m:f", "concurrency": 8, "timeoutSeconds": 2},
        "spec.processor.concurrency: and spec.processor.timeoutSeconds: a call on a thread",
    ),
    (
        "spec.processor",
        {"function": "m:f", "concurrency": 8, "maxMemoryMiB": 256},
        "spec.processor.concurrency: and spec.processor.maxMemoryMiB: recycling needs",
    ),
    ("spec.errors", {"policy": "dlq"}, "spec.errors.dlq.topic: is required when policy is dlq"),
    (
        "spec.errors",
        {"policy": "retry-forever"},
        "spec.errors.policy: expected one of dlq, skip, stop",
    ),
    (
        "spec.errors",
        {"retryTopics": [{"delaySeconds": 10}], "ordering": "strict"},
        "spec.errors: retryTopics and ordering: strict cannot be combined",
    ),
    (
        "spec.errors",
        {"ordering": "fifo"},
        "spec.errors.ordering: expected one of relaxed, strict, got 'fifo'",
    ),
    (
        "spec.errors",
        {"retryTopics": [{"delaySeconds": 10}, {"delaySeconds": 10}]},
        "spec.errors.retryTopics[1].delaySeconds: 10 appears twice",
    ),
    (
        "spec.errors",
        {"retryTopics": [{"delaySeconds": 0}]},
        "spec.errors.retryTopics[0].delaySeconds: expected at least 1, got 0",
    ),
    (
        "spec.errors",
        {"retryTopics": [{"delaySeconds": 1.5}]},
        "spec.errors.retryTopics[0].delaySeconds: expected an integer, got the number 1.5",
    ),
    ("spec.errors", {"retryTopics": [{}]}, "spec.errors.retryTopics[0].delaySeconds: is required"),
    (
        "spec.errors",
        {"retryTopics": [{"delay": 10}]},
        "spec.errors.retryTopics[0].delay: unknown field",
    ),
    (
        "spec.errors",
        {"retryTopics": {"delaySeconds": 10}},
        "spec.errors.retryTopics: expected a list of mappings, got a mapping",
    ),
    (
        "spec.kafka.config",
        {"linger.ms": {"nested": 1}},
        "spec.kafka.config.linger.ms: expected a string or number, got a mapping",
    ),
    ("spec.metrics", {"port": 70000}, "spec.metrics.port: expected at most 65535, got 70000"),
    ("spec.bogus", 1, "spec.bogus: unknown field"),
    (
        "apiVersion",
        "offtake.dev/v2",
        "apiVersion: expected offtake.dev/v1alpha1, got 'offtake.dev/v2'",
    ),
    ("metadata", {}, "metadata.name: is required"),
    (
        "spec.sink",
        {"spark": {"format": "parquet"}},
        "spec.sink.spark.path: is required when format is parquet",
    ),
]


@pytest.mark.parametrize(
    ("path", "value", "message"), CASES, ids=[c[0] + "-" + str(i) for i, c in enumerate(CASES)]
)
def test_each_bad_field_is_named_with_what_was_expected(
    path: str, value: Any, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_pipeline(with_change(path, value))
    assert message in str(info.value)


def test_good_manifest_gets_documented_defaults() -> None:
    spec = parse_pipeline(GOOD)
    assert spec.source.group_id == "shop.orders"
    assert spec.source.start_from == "earliest"
    assert spec.commit.interval_seconds == 1.0
    assert (spec.limits.max_in_flight_messages, spec.limits.max_in_flight_bytes) == (
        10_000,
        67_108_864,
    )
    assert spec.errors.policy == "stop" and spec.errors.max_retries == 3
    assert spec.shutdown.drain_timeout_seconds == 25.0 and spec.metrics.port == 9100
    assert spec.errors.retry_topics == () and spec.errors.ordering == "relaxed"
    assert (spec.processor.concurrency, spec.processor.order) == (1, "key")


def test_concurrency_with_an_order_and_parallelism_1_is_accepted() -> None:
    doc = with_change("spec.processor", {"function": "m:f", "concurrency": 500, "order": "none"})
    doc["spec"]["processor"]["parallelism"] = 1
    p = parse_pipeline(doc).processor
    assert (p.concurrency, p.order, p.in_processes) == (500, "none", False)
    # order with concurrency 1 is accepted: one call at a time keeps any order (documented).
    assert parse_pipeline(with_change("spec.processor", {"function": "m:f", "order": "key"}))


def test_retry_topics_are_named_after_each_source_topic_in_order() -> None:
    doc = with_change("spec.errors", {"retryTopics": [{"delaySeconds": 10}, {"delaySeconds": 60}]})
    doc["spec"]["source"]["topics"] = ["orders", "refunds"]
    spec = parse_pipeline(doc)
    assert [r.delay_seconds for r in spec.errors.retry_topics] == [10, 60]
    assert spec.errors.retry_topic_names(spec.source.topics) == [
        "orders.retry-10s",
        "orders.retry-60s",
        "refunds.retry-10s",
        "refunds.retry-60s",
    ]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "offtake.cli", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "kind: ConsumerPipeline\napiVersion: offtake.dev/v1alpha1\nspec: [unclosed",
            "not valid YAML",
        ),
        (
            "kind: Deployment\n",
            "expected exactly one document of kind ConsumerPipeline, found none",
        ),
        (
            yaml.safe_dump(with_change("spec.limits", {"maxInFlightMessages": "lots"})),
            "spec.limits.maxInFlightMessages: expected an integer, got the string 'lots'",
        ),
    ],
)
def test_worker_cli_exits_2_with_the_field_named_and_no_traceback(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    for args in (("worker", "--pipeline", str(path)), ("validate", str(path))):
        result = run_cli(*args)
        assert result.returncode == 2, result
        assert message in result.stderr
        assert "Traceback" not in result.stderr


def test_missing_manifest_file_is_a_clear_error(tmp_path: Path) -> None:
    result = run_cli("worker", "--pipeline", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2
    assert "cannot read the manifest" in result.stderr and "Traceback" not in result.stderr


def test_unimportable_function_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        yaml.safe_dump(with_change("spec.processor", {"function": "no_such_module:handle"}))
    )
    result = run_cli("worker", "--pipeline", str(path), "--metrics-port", "0")
    assert result.returncode == 2, result.stderr
    assert "spec.processor.function: cannot import module 'no_such_module'" in result.stderr
    assert "Traceback" not in result.stderr


def test_exactly_once_without_transactions_is_a_clear_error() -> None:
    """The in-memory broker (the test kit's) has no transactions: say so, name the field."""
    from offtake.engine.assembly import build_worker
    from offtake.kafka.memory import MemoryBroker

    spec = parse_pipeline(
        with_change("spec.sink", {"kafka": {"topic": "out", "delivery": "exactly-once"}})
    )
    assert spec.sink.kafka is not None and spec.sink.kafka.exactly_once
    with pytest.raises(ConfigError) as info:
        build_worker(spec, clients=MemoryBroker().clients())
    assert str(info.value).startswith("spec.sink.kafka.delivery: exactly-once needs Kafka")


@pytest.mark.parametrize(
    ("protocol", "expected"),
    [
        (None, {"partition.assignment.strategy": "cooperative-sticky"}),
        ("range", {"partition.assignment.strategy": "range"}),
        ("consumer", {"group.protocol": "consumer"}),
    ],
)
def test_group_protocol_becomes_the_consumer_settings(
    protocol: str | None, expected: dict[str, str]
) -> None:
    from offtake.kafka.config import consumer_config

    doc = with_change("spec.kafka.config", {"session.timeout.ms": "6000"})
    if protocol is not None:
        doc["spec"]["kafka"]["groupProtocol"] = protocol
    conf = consumer_config(parse_pipeline(doc))
    assert {k: conf.get(k) for k in expected} == expected
    if protocol == "consumer":  # KIP-848: the broker assigns and times sessions
        assert "partition.assignment.strategy" not in conf and "session.timeout.ms" not in conf
    else:
        assert conf["session.timeout.ms"] == "6000" and "group.protocol" not in conf


def test_group_protocol_and_an_assignment_strategy_in_config_conflict() -> None:
    doc = with_change("spec.kafka.config", {"partition.assignment.strategy": "range"})
    doc["spec"]["kafka"]["groupProtocol"] = "consumer"
    with pytest.raises(ConfigError) as info:
        parse_pipeline(doc)
    assert str(info.value).startswith("spec.kafka.groupProtocol: set either groupProtocol or")


def test_a_topic_pattern_cannot_have_retry_topics() -> None:
    doc = with_change("spec.source.topics", ["^orders\\..*"])
    doc["spec"]["errors"] = {"retryTopics": [{"delaySeconds": 10}]}
    with pytest.raises(ConfigError, match=r"^spec.errors.retryTopics: cannot be combined with a"):
        parse_pipeline(doc)
    del doc["spec"]["errors"]
    assert parse_pipeline(doc).source.patterns == ("^orders\\..*",)
