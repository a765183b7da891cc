"""A schema registry that refuses one schema id (issue 38 item 6): that id's records are dead-
lettered with the id and the registry's answer, the next records flow; only a registry that
refuses every request (the subject listing too) is an outage, and the records wait.

The real registry (Apicurio) sits behind a real HTTP proxy that answers 403 for the schema ids
a test denies (support.registries says why Apicurio cannot itself). A registry that refuses
the credentials everywhere is the real Apicurio with a wrong password
(tests/worker/test_schema_registry_secured.py, 401 for the listing as well).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from support.registries import DenyingProxy, two_schemas
from support.schemas import order
from support.workers import (
    WorkerProcess,
    manifest,
    produce,
    read_all,
    wait_caught_up,
    write_manifest,
)

from offtake.formats.errors import SCHEMA_REFUSED, RegistryUnavailable, SchemaDecodeError
from offtake.formats.resolve import schema_decoder
from offtake.formats.wire import wire_schema_id
from offtake.headers import H_ERROR_MESSAGE, H_REASON, H_SCHEMA_ID
from offtake_testbed.apicurio import ApicurioRegistry
from offtake_testbed.kafka import KafkaBroker


@pytest.fixture
def proxy(schema_registry: ApicurioRegistry) -> Iterator[DenyingProxy]:
    with DenyingProxy(schema_registry.url) as p:
        yield p


def test_one_refused_id_fails_its_record_and_a_refusing_registry_is_an_outage(
    schema_registry: ApicurioRegistry, proxy: DenyingProxy, topic_factory: Any
) -> None:
    topic = topic_factory()
    theirs, ours = two_schemas(schema_registry.url, topic)
    denied_value, our_value = theirs(order(1)), ours(order(2))
    denied_id = wire_schema_id(denied_value)
    assert denied_id != wire_schema_id(our_value)
    proxy.denied.add(denied_id)
    decoder = schema_decoder("avro", SchemaRegistryClient({"url": proxy.url, "max.retries": 0}))

    with pytest.raises(SchemaDecodeError) as refused:
        decoder.value(denied_value, topic)
    assert refused.value.headers == {H_SCHEMA_ID: str(denied_id), H_REASON: SCHEMA_REFUSED}
    assert f"schema id {denied_id} is refused by the schema registry" in str(refused.value)
    assert "denied operation Read" in str(refused.value) and "403" in str(refused.value)
    assert decoder.value(our_value, topic) == order(2), "the next id is read as ever"
    # The refusal is remembered: the same id's next record asks the registry nothing.
    asked = len(proxy.requests)
    with pytest.raises(SchemaDecodeError):
        decoder.value(denied_value, topic)
    assert len(proxy.requests) == asked

    # The registry refuses everything (the listing too): no record's fault, an outage.
    fresh = schema_decoder("avro", SchemaRegistryClient({"url": proxy.url, "max.retries": 0}))
    proxy.deny_all = True
    with pytest.raises(RegistryUnavailable, match="refuses this pipeline's credentials"):
        fresh.value(our_value, topic)
    proxy.deny_all = False
    assert fresh.value(our_value, topic) == order(2), "and reads once it answers again"


def test_a_worker_dead_letters_the_refused_id_and_the_next_records_flow(
    schema_registry: ApicurioRegistry,
    proxy: DenyingProxy,
    kafka_broker: KafkaBroker,
    topic_factory: Any,
    tmp_path: Path,
) -> None:
    src, out, dlq = topic_factory(), topic_factory(), topic_factory()
    theirs, ours = two_schemas(schema_registry.url, src)
    values = [ours(order(i)) if i != 3 else theirs(order(i)) for i in range(10)]
    denied_id = wire_schema_id(values[3])
    proxy.denied.add(denied_id)
    produce(kafka_broker.bootstrap, src, values)
    doc = manifest(
        "schema-refused",
        kafka_broker.bootstrap,
        [src],
        sink={"kafka": {"topic": out}},
        errors={"policy": "dlq", "maxRetries": 0, "dlq": {"topic": dlq}},
    )
    doc["spec"]["source"].update({"format": "avro", "schemaRegistry": {"url": proxy.url}})
    worker = WorkerProcess(write_manifest(tmp_path / "p.yaml", doc), tmp_path / "w.log").start()
    try:
        wait_caught_up(kafka_broker.bootstrap, doc["spec"]["source"]["groupId"], src, 1)
    finally:
        code = worker.terminate()
    assert code == 0, worker.output()[-3000:]
    delivered = sorted(json.loads(m.value())["id"] for m in read_all(kafka_broker.bootstrap, out))
    assert delivered == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    (letter,) = read_all(kafka_broker.bootstrap, dlq)
    headers = {k: v.decode() for k, v in letter.headers() or []}
    assert letter.value() == values[3], "the raw bytes, for a redrive once the id is readable"
    assert headers[H_SCHEMA_ID] == str(denied_id)
    assert headers[H_REASON] == SCHEMA_REFUSED
    assert "403" in headers[H_ERROR_MESSAGE] and "denied operation Read" in headers[H_ERROR_MESSAGE]
    # The outage's log line (engine/work.py): never written for a refused id.
    assert "records wait, nothing is dead-lettered" not in worker.output()


def test_the_refused_ids_remembered_are_bounded(
    schema_registry: ApicurioRegistry,
    proxy: DenyingProxy,
    topic_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A producer naming a new refused id per record costs memory for at most REFUSED_KEPT
    (8 here, so the test asks the registry a few dozen times, not thousands)."""
    from offtake.formats import wire

    monkeypatch.setattr(wire, "REFUSED_KEPT", 8)
    topic = topic_factory()
    _, ours = two_schemas(schema_registry.url, topic)
    body = ours(order(1))[wire.HEADER_SIZE :]
    decoder = schema_decoder("avro", SchemaRegistryClient({"url": proxy.url, "max.retries": 0}))
    first = 10**6
    proxy.denied.update(range(first, first + wire.REFUSED_KEPT + 5))
    for schema_id in range(first, first + wire.REFUSED_KEPT + 5):
        with pytest.raises(SchemaDecodeError):
            decoder.value(wire.header(schema_id) + body, topic)
    assert 0 < len(decoder._refused) <= 8  # type: ignore[attr-defined]
