"""The test kit with schema'd records and no registry: process() and pipelines on the memory
broker decode avro | protobuf | jsonschema like the worker, through confluent-kafka's own
in-memory registry client, and the Kafka sink encodes with a schema there too."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest
from support.orders_pb import Order
from support.schemas import ORDER_AVRO, ORDER_JSON_SCHEMA, order

from offtake.formats.resolve import schema_decoder
from offtake.records import Record
from offtake.testing import MemoryBroker, encode, in_memory_registry, process, run_pipeline

SCHEMAS: dict[str, Any] = {"avro": ORDER_AVRO, "protobuf": Order, "jsonschema": ORDER_JSON_SCHEMA}


def total(record: Record) -> dict[str, Any]:
    return {"id": record.value["id"], "total": record.value["amount"] * 2}


@pytest.mark.parametrize("fmt", sorted(SCHEMAS))
def test_process_decodes_each_format_like_the_worker(fmt: str) -> None:
    seen: list[Record] = []

    def keep(record: Record) -> Any:
        seen.append(record)
        return total(record)

    assert process(keep, order(7), format=fmt, schema=SCHEMAS[fmt]) == [{"id": 7, "total": 21.0}]
    assert seen[0].value == order(7)
    assert seen[0].raw_value is not None and seen[0].raw_value[:1] == b"\x00"  # wire format


def test_process_gives_avro_logical_types_as_the_worker_does() -> None:
    schema = {
        "type": "record",
        "name": "Payment",
        "fields": [
            {
                "name": "amount",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
            },
            {"name": "tags", "type": {"type": "array", "items": "string"}},
        ],
    }
    (value,) = process(
        lambda r: r.value, {"amount": Decimal("12.30"), "tags": ["a"]}, format="avro", schema=schema
    )
    assert value == {"amount": Decimal("12.30"), "tags": ["a"]}


def test_process_refuses_a_value_that_does_not_fit_the_schema() -> None:
    with pytest.raises(Exception, match="amount"):
        process(total, {"id": 1, "item": "x"}, format="avro", schema=ORDER_AVRO)
    with pytest.raises(ValueError, match="needs schema="):
        process(total, order(1), format="avro")


def test_a_pipeline_decodes_avro_and_encodes_jsonschema_without_a_registry() -> None:
    broker = MemoryBroker()
    registry = in_memory_registry()
    registry.register_schema("totals-value", _json_schema_of_totals())
    broker.create_topic("orders", 2)
    for i in range(50):
        broker.produce(
            "orders",
            encode("avro", order(i), ORDER_AVRO, registry=registry, topic="orders"),
            key=str(i),
        )
    broker.produce("orders", b"not in the wire format", key="poison")
    doc = {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": "avro-kit", "namespace": "shop"},
        "spec": {
            "kafka": {"bootstrapServers": "unused:9092"},
            "source": {
                "topics": ["orders"],
                "groupId": "g",
                "format": "avro",
                "schemaRegistry": {"url": "http://registry.invalid:8080"},
            },
            "sink": {
                "kafka": {
                    "topic": "totals",
                    "format": "jsonschema",
                    "schema": {"subject": "totals-value"},
                }
            },
            "errors": {"policy": "dlq", "maxRetries": 0, "dlq": {"topic": "dlq"}},
            "commit": {"intervalSeconds": 0.05},
        },
    }
    run = run_pipeline(copy.deepcopy(doc), broker, processor=total, schema_registry=registry)
    assert run.ok, run
    decoder = schema_decoder("jsonschema", registry)
    values = sorted(
        (decoder.value(m.value(), "totals") for m in run.output_messages), key=lambda v: v["id"]
    )
    assert values == [{"id": i, "total": i * 3.0} for i in range(50)]
    (dead,) = run.dlq
    assert dict(dead.headers())["offtake.error.reason"] == b"not-wire-format"


def _json_schema_of_totals() -> Any:
    import json

    from confluent_kafka.schema_registry import Schema

    body = {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "total": {"type": "number"}},
    }
    return Schema(json.dumps(body), "JSON")


def test_a_topic_pattern_reads_every_matching_topic_of_the_memory_broker() -> None:
    broker = MemoryBroker()
    for topic in ("orders.eu", "orders.us", "payments"):
        broker.create_topic(topic, 2)
        for i in range(10):
            broker.produce(topic, {"id": i, "topic": topic}, key=str(i))
    doc = {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": "pattern-kit", "namespace": "shop"},
        "spec": {
            "kafka": {"bootstrapServers": "unused:9092"},
            "source": {"topics": ["^orders\\..*"], "groupId": "g"},
            "sink": {"kafka": {"topic": "out"}},
            "commit": {"intervalSeconds": 0.05},
        },
    }
    run = run_pipeline(doc, broker)
    assert run.ok, run
    assert sorted(v["topic"] for v in run.outputs) == ["orders.eu"] * 10 + ["orders.us"] * 10
    assert {t for t, _ in run.committed} == {"orders.eu", "orders.us"}
    assert "^orders\\..*" not in broker.topics()
