"""The Kafka sink with a schema, on the real broker and the real schema registry: JSON in,
Avro out (confluent-kafka's serializer) and back to JSON through a second pipeline; a schema
that is not registered or that the registry refuses stops the worker with a message naming
the subject; a value that does not fit the schema is dead-lettered, the others go on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from support.schemas import ORDER_AVRO, ORDER_AVRO_V2, order
from support.workers import (
    WorkerProcess,
    manifest,
    produce,
    read_all,
    wait_caught_up,
    write_manifest,
)

from offtake_testbed.apicurio import ApicurioRegistry
from offtake_testbed.kafka import KafkaBroker

EXIT_CONFIG = 2


def _run_to_end(doc: dict[str, Any], tmp_path: Path, name: str, bootstrap: str, src: str) -> str:
    worker = WorkerProcess(write_manifest(tmp_path / f"{name}.yaml", doc), tmp_path / f"{name}.log")
    worker.start()
    wait_caught_up(bootstrap, doc["spec"]["source"]["groupId"], src, 1)
    assert worker.terminate() == 0, worker.output()[-3000:]
    return worker.output()


def test_json_to_avro_and_back(
    kafka_broker: KafkaBroker,
    schema_registry: ApicurioRegistry,
    topic_factory: Any,
    tmp_path: Path,
) -> None:
    src, avro_topic, back, dlq = (topic_factory() for _ in range(4))
    schema_file = tmp_path / "order.avsc"
    schema_file.write_text(json.dumps(ORDER_AVRO))
    bad = {"id": 999, "item": "no amount"}  # misses a required field: cannot be encoded
    produce(kafka_broker.bootstrap, src, [*(order(i) for i in range(100)), bad])
    to_avro = manifest(
        "to-avro",
        kafka_broker.bootstrap,
        [src],
        sink={
            "kafka": {
                "topic": avro_topic,
                "format": "avro",
                "schema": {"file": str(schema_file)},
                "autoRegister": True,
                "schemaRegistry": {"url": schema_registry.url},
            }
        },
        errors={"policy": "dlq", "maxRetries": 0, "dlq": {"topic": dlq}},
    )
    _run_to_end(to_avro, tmp_path, "to-avro", kafka_broker.bootstrap, src)
    encoded = read_all(kafka_broker.bootstrap, avro_topic)
    assert len(encoded) == 100
    assert all(m.value()[:1] == b"\x00" for m in encoded)  # the wire format's magic byte
    (dead,) = read_all(kafka_broker.bootstrap, dlq)
    headers = {k: (v or b"").decode() for k, v in dead.headers() or ()}
    assert json.loads(dead.value()) == bad
    assert headers["offtake.error.stage"] == "sink"
    assert "amount" in headers["offtake.error.message"]

    from_avro = manifest(
        "from-avro",
        kafka_broker.bootstrap,
        [avro_topic],
        sink={"kafka": {"topic": back}},
    )
    from_avro["spec"]["source"].update(
        {"format": "avro", "schemaRegistry": {"url": schema_registry.url}}
    )
    _run_to_end(from_avro, tmp_path, "from-avro", kafka_broker.bootstrap, avro_topic)
    values = [json.loads(m.value()) for m in read_all(kafka_broker.bootstrap, back)]
    assert sorted(values, key=lambda v: v["id"]) == [order(i) for i in range(100)]


def _start_failing(doc: dict[str, Any], tmp_path: Path) -> str:
    worker = WorkerProcess(write_manifest(tmp_path / "p.yaml", doc), tmp_path / "w.log").start()
    assert worker.wait(120) == EXIT_CONFIG, worker.output()[-3000:]
    return worker.output()


def test_an_unregistered_or_incompatible_schema_stops_the_worker_naming_the_subject(
    kafka_broker: KafkaBroker,
    schema_registry: ApicurioRegistry,
    topic_factory: Any,
    tmp_path: Path,
) -> None:
    src, out = topic_factory(), topic_factory()
    schema_file = tmp_path / "order.avsc"
    schema_file.write_text(json.dumps(ORDER_AVRO))
    sink = {
        "topic": out,
        "format": "avro",
        "schema": {"file": str(schema_file)},
        "schemaRegistry": {"url": schema_registry.url},
    }
    doc = manifest("unregistered", kafka_broker.bootstrap, [src], sink={"kafka": sink})
    output = _start_failing(doc, tmp_path)
    assert f"subject '{out}-value'" in output
    assert "not registered" in output and "autoRegister" in output

    # The subject holds v1 under BACKWARD compatibility; a new required field without a
    # default cannot read v1's records: the registry refuses it, and the worker says so.
    client = SchemaRegistryClient({"url": schema_registry.url})
    subject = f"{out}-value"
    client.register_schema(subject, Schema(json.dumps(ORDER_AVRO), "AVRO"))
    client.set_compatibility(subject, "BACKWARD")
    incompatible = tmp_path / "order-v3.avsc"
    incompatible.write_text(json.dumps(_with_required_field()))
    sink = {**sink, "schema": {"file": str(incompatible)}, "autoRegister": True}
    doc = manifest("incompatible", kafka_broker.bootstrap, [src], sink={"kafka": sink})
    output = _start_failing(doc, tmp_path)
    assert f"subject '{subject}'" in output and "incompatible" in output
    # The compatible change (ORDER_AVRO_V2, a new optional field) registers fine:
    client.register_schema(subject, Schema(json.dumps(ORDER_AVRO_V2), "AVRO"))


def _with_required_field() -> dict[str, Any]:
    """ORDER_AVRO plus a field without a default: not BACKWARD compatible with it."""
    return {**ORDER_AVRO, "fields": [*ORDER_AVRO["fields"], {"name": "currency", "type": "string"}]}
