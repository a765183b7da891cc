"""avro, protobuf and jsonschema sources on the real broker and the real schema registry
(Apicurio, Confluent-compatible API): records decode with the writer's schema, poison records
of each kind go to the dead-letter topic naming the schema id and the reason, and a registry
that stops answering holds records back (backpressure) without dead-lettering any."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from support.schemas import (
    FORMATS,
    ORDER_AVRO_V2,
    PROTOBUF_MESSAGE,
    order,
    serializer,
)
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

RECORDS = 200
LONG_OUTAGE_OPT_IN = "OFFTAKE_REGISTRY_OUTAGE_30S"


def _source(fmt: str, topic: str, registry: ApicurioRegistry) -> dict[str, Any]:
    source: dict[str, Any] = {
        "topics": [topic],
        "format": fmt,
        "schemaRegistry": {"url": registry.url},
    }
    if fmt == "protobuf":
        source["protobufMessage"] = PROTOBUF_MESSAGE
    return source


def _headers(message: Any) -> dict[str, str]:
    return {k: (v or b"").decode() for k, v in message.headers() or ()}


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_reaches_a_kafka_sink_and_each_poison_kind_is_dead_lettered(
    fmt: str,
    kafka_broker: KafkaBroker,
    schema_registry: ApicurioRegistry,
    topic_factory: Any,
    tmp_path: Path,
) -> None:
    src, out, dlq = topic_factory(2), topic_factory(), topic_factory()
    encode = serializer(fmt, schema_registry.url, src)
    good = [encode(order(i)) for i in range(RECORDS)]
    schema_id = struct.unpack(">bI", good[0][:5])[1]
    poison = {
        "not-wire-format": json.dumps(order(-1)).encode(),
        "unknown-schema-id": b"\x00" + struct.pack(">I", 987_654) + good[0][5:],
        "schema-mismatch": good[0][:5] + b"\xff\xfe\xfd not an encoded order",
    }
    # jsonschema: also a value that is valid JSON but breaks its schema (the deserializer
    # validates); the garbage above fails earlier, as JSON.
    breaks_schema = good[0][:5] + json.dumps({"id": "not a number", "item": 3}).encode()
    extra = [breaks_schema] if fmt == "jsonschema" else []
    produce(kafka_broker.bootstrap, src, [*good[:100], *poison.values(), *extra, *good[100:]])
    doc = manifest(
        f"schema-{fmt}",
        kafka_broker.bootstrap,
        [src],
        sink={"kafka": {"topic": out}},
        errors={"policy": "dlq", "maxRetries": 0, "dlq": {"topic": dlq}},
    )
    doc["spec"]["source"].update(_source(fmt, src, schema_registry))
    worker = WorkerProcess(write_manifest(tmp_path / "p.yaml", doc), tmp_path / "w.log").start()
    wait_caught_up(kafka_broker.bootstrap, doc["spec"]["source"]["groupId"], src, 2)
    assert worker.terminate() == 0, worker.output()[-3000:]

    delivered = sorted(
        (json.loads(m.value()) for m in read_all(kafka_broker.bootstrap, out)),
        key=lambda v: v["id"],
    )
    assert delivered == [order(i) for i in range(RECORDS)]
    letters = read_all(kafka_broker.bootstrap, dlq)
    assert len(letters) == len(poison) + len(extra)
    dead = {_headers(m)["offtake.error.reason"]: m for m in letters if m.value() not in extra}
    assert set(dead) == set(poison)
    for m in letters:
        if m.value() in extra:
            headers = _headers(m)
            assert headers["offtake.error.reason"] == "schema-mismatch"
            assert headers["offtake.schema.id"] == str(schema_id)
            assert "is not of type" in headers["offtake.error.message"]
    for reason, raw in poison.items():
        headers = _headers(dead[reason])
        assert dead[reason].value() == raw  # byte for byte
        assert headers["offtake.error.stage"] == "decode"
        expected_id = {"not-wire-format": "", "unknown-schema-id": "987654"}
        assert headers["offtake.schema.id"] == expected_id.get(reason, str(schema_id))
        assert src in headers["offtake.error.message"]


def _avro_worker_past_100(
    name: str,
    kafka_broker: KafkaBroker,
    schema_registry: ApicurioRegistry,
    topic_factory: Any,
    tmp_path: Path,
) -> tuple[str, str, str, str, WorkerProcess]:
    """An avro pipeline (dead letters on, at most 50 records in flight) whose worker has
    delivered its first 100 records, so the registry's first schema is known to it; returns
    the source, output and dead-letter topics, the group and the worker."""
    src, out, dlq = topic_factory(), topic_factory(), topic_factory()
    encode = serializer("avro", schema_registry.url, src)
    produce(kafka_broker.bootstrap, src, [encode(order(i)) for i in range(100)])
    doc = manifest(
        name,
        kafka_broker.bootstrap,
        [src],
        sink={"kafka": {"topic": out}},
        errors={"policy": "dlq", "maxRetries": 0, "dlq": {"topic": dlq}},
        limits={"maxInFlightMessages": 50},
    )
    doc["spec"]["source"].update(_source("avro", src, schema_registry))
    worker = WorkerProcess(write_manifest(tmp_path / "p.yaml", doc), tmp_path / "w.log").start()
    worker.wait_until(lambda: len(read_all(kafka_broker.bootstrap, out)) == 100, "100 records")
    return src, out, dlq, doc["spec"]["source"]["groupId"], worker


def test_registry_stopped_for_30s_mid_run_loses_nothing_and_dead_letters_nothing(
    kafka_broker: KafkaBroker,
    schema_registry: ApicurioRegistry,
    topic_factory: Any,
    tmp_path: Path,
) -> None:
    src, out, dlq, group, worker = _avro_worker_past_100(
        "schema-outage", kafka_broker, schema_registry, topic_factory, tmp_path
    )
    # A second version of the schema (a new optional field): registered while the registry is
    # up, first seen by the worker while it is down, so the worker must ask for it then.
    v2 = serializer("avro", schema_registry.url, src, ORDER_AVRO_V2)
    later = [v2({**order(i), "note": f"n{i}"}) for i in range(100, 400)]  # encoded: registered
    before = len(worker.output())  # what the worker logs from the outage on
    schema_registry.freeze()
    down_at = time.monotonic()
    try:
        produce(kafka_broker.bootstrap, src, later)
        # The outage lasts until the worker has shown how it waits (it asked the registry and
        # retries; the in-flight bound paused the partition), and 30 s at least: that length
        # is the fault injected, not a wait for the worker.
        worker.wait_until(
            lambda: waiting_for_registry(worker.output()[before:]), "retries and a pause"
        )
        time.sleep(max(0.0, down_at + 30 - time.monotonic()))
        assert worker.proc is not None and worker.proc.poll() is None, worker.output()[-3000:]
        during = len(read_all(kafka_broker.bootstrap, out))
        log = worker.output()[before:]
    finally:
        schema_registry.thaw()
    assert during == 100  # nothing of the new schema could be decoded...
    assert "schema registry" in log and "retrying" in log
    assert "backpressure: paused" in log  # ...and the in-flight bound paused the partition
    wait_caught_up(kafka_broker.bootstrap, group, src, 1)
    assert worker.terminate() == 0, worker.output()[-3000:]
    ids = sorted(json.loads(m.value())["id"] for m in read_all(kafka_broker.bootstrap, out))
    assert ids == list(range(400))
    assert read_all(kafka_broker.bootstrap, dlq) == []


def waiting_for_registry(log: str) -> bool:
    """Whether a worker's log shows it waiting out a registry outage: retrying the schema's
    fetch, with the in-flight bound's pause."""
    return "schema registry" in log and "retrying" in log and "backpressure: paused" in log


@pytest.mark.parametrize(
    "outage",
    [
        10.0,
        pytest.param(
            30.0,
            marks=pytest.mark.skipif(
                os.environ.get(LONG_OUTAGE_OPT_IN) != "1",
                reason=f"the 30 s variant: {LONG_OUTAGE_OPT_IN}=1 pytest -p no:cacheprovider -q "
                "tests/worker/test_schema_formats_on_kafka.py -k process_stopped",
            ),
        ),
    ],
    ids=lambda s: f"{s:.0f}s",
)
def test_registry_process_stopped_mid_run_and_restarted_loses_nothing(
    outage: float,
    kafka_broker: KafkaBroker,
    schema_registry: ApicurioRegistry,
    topic_factory: Any,
    tmp_path: Path,
) -> None:
    """The registry's process ends (connections refused, not hanging) while records of a
    schema the worker has not fetched yet arrive, and starts again ``outage`` seconds later
    with its storage: the worker waits with backpressure (metrics show it), then delivers
    everything; nothing is lost or dead-lettered."""
    src, out, dlq, group, worker = _avro_worker_past_100(
        "schema-restart", kafka_broker, schema_registry, topic_factory, tmp_path
    )
    v2 = serializer("avro", schema_registry.url, src, ORDER_AVRO_V2)
    later = [v2({**order(i), "note": f"n{i}"}) for i in range(100, 400)]  # registers v2
    backpressure_before = worker.metric("offtake_backpressure_seconds_total")
    schema_registry.stop_process()
    down_at = time.monotonic()
    try:
        produce(kafka_broker.bootstrap, src, later)
        # Down until the worker shows it waits with backpressure (the partition paused, on
        # /metrics), and ``outage`` seconds at least: that length is the fault injected.
        worker.wait_until(
            lambda: worker.metric("offtake_paused_partitions") >= 1, "the partition paused"
        )
        time.sleep(max(0.0, down_at + outage - time.monotonic()))
        assert worker.proc is not None and worker.proc.poll() is None, worker.output()[-3000:]
        during = len(read_all(kafka_broker.bootstrap, out))
        waited = worker.metric("offtake_backpressure_seconds_total") - backpressure_before
        log = worker.output()
    finally:
        schema_registry.restart()
    assert during == 100  # nothing of the new schema could be decoded...
    assert "schema registry" in log and "retrying" in log
    assert waited > 0, waited  # ...and the in-flight bound paused the partition: backpressure
    wait_caught_up(kafka_broker.bootstrap, group, src, 1)
    assert worker.terminate() == 0, worker.output()[-3000:]
    ids = sorted(json.loads(m.value())["id"] for m in read_all(kafka_broker.bootstrap, out))
    assert ids == list(range(400))
    assert read_all(kafka_broker.bootstrap, dlq) == []
