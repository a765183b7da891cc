"""Schema'd sources into the parquet sink on the real broker, the real registry (Apicurio) and
Spark: the table's column types follow the writer's schema (records, arrays, maps, decimals,
timestamps, dates, enums, nullable unions; protobuf messages, repeated fields, maps and
Timestamp; JSON Schema types), a compatible schema change adds a column without losing rows,
and an incompatible one stops the pipeline naming the field and the schema ids, with nothing
written, committed or dead-lettered past it.

The worker runs in this process (the engine as the CLI builds it) with the shared local
SparkSession: one JVM for all of it."""

from __future__ import annotations

import datetime as dt
import logging
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pytest
from support.schemas import (
    ORDER_AVRO,
    ORDER_AVRO_V2,
    PLACED,
    RICH_PROTOBUF_MESSAGE,
    order,
    rich_order,
    rich_serializer,
    serializer,
)
from support.workers import committed, manifest, produce, read_all, wait_caught_up

from offtake.engine.worker import EXIT_STOPPED_ON_ERROR
from offtake_testbed.apicurio import ApicurioRegistry
from offtake_testbed.kafka import KafkaBroker

from .support import EngineThread

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

RECORDS = 12


def _doc(
    fmt: str, bootstrap: str, src: str, path: Path, registry: ApicurioRegistry, dlq: str
) -> dict[str, Any]:
    doc = manifest(
        f"typed-{fmt}",
        bootstrap,
        [src],
        sink={
            "spark": {
                "format": "parquet",
                "path": str(path),
                "batch": {"maxRecords": 1000, "maxIntervalSeconds": 1},
            }
        },
        errors={"policy": "dlq", "maxRetries": 0, "dlq": {"topic": dlq}},
    )
    doc["spec"]["source"].update({"format": fmt, "schemaRegistry": {"url": registry.url}})
    if fmt == "protobuf":
        doc["spec"]["source"]["protobufMessage"] = RICH_PROTOBUF_MESSAGE
    return doc


def _table(path: Path) -> pa.Table:
    """Every data file, under the union of their schemas (older files lack newer columns)."""
    files = sorted(str(p) for p in path.rglob("*.parquet"))
    assert files, f"no parquet files under {path}"
    schemas = [pads.dataset(f).schema for f in files]
    return pads.dataset(files, schema=pa.unify_schemas(schemas)).to_table()


EXPECTED_SPARK = {
    "avro": {
        "id": "bigint",
        "customer": "struct<name:string,tier:string>",
        "lines": "array<struct<sku:string,qty:int>>",
        "attrs": "map<string,string>",
        "total": "decimal(10,2)",
        "placed": "timestamp",
        "day": "date",
        "note": "string",
    },
    "protobuf": {
        "id": "bigint",
        "customer": "struct<name:string,tier:string>",
        "lines": "array<struct<sku:string,qty:int>>",
        "attrs": "map<string,string>",
        "total": "double",
        "placed": "timestamp",
        "blob": "binary",
    },
    "jsonschema": {
        "id": "bigint",
        "customer": "struct<name:string,tier:string>",
        "lines": "array<struct<sku:string,qty:bigint>>",
        "attrs": "map<string,string>",
        "total": "double",
        "placed": "timestamp",
        "day": "date",
        "note": "string",
    },
}


@pytest.mark.parametrize("fmt", ["avro", "protobuf", "jsonschema"])
def test_each_format_lands_in_parquet_with_its_schemas_column_types(
    fmt: str,
    kafka_broker: KafkaBroker,
    schema_registry: ApicurioRegistry,
    topic_factory: Any,
    spark: Any,
    tmp_path: Path,
) -> None:
    src, dlq = topic_factory(), topic_factory()
    encode = rich_serializer(fmt, schema_registry.url, src)
    path = tmp_path / "table"
    doc = _doc(fmt, kafka_broker.bootstrap, src, path, schema_registry, dlq)
    group = doc["spec"]["source"]["groupId"]
    # Two runs: the second checks its records against the columns the first wrote (read back
    # through Spark), and every mapped type must match them.
    for run, records in enumerate((range(RECORDS - 2), range(RECORDS - 2, RECORDS))):
        produce(kafka_broker.bootstrap, src, [encode(rich_order(fmt, i)) for i in records])
        running = EngineThread(doc, spark)
        try:
            wait_caught_up(kafka_broker.bootstrap, group, src, 1)
        finally:
            assert running.stop() == 0, f"run {run}"

    table = _table(path)
    types = {f.name: f.type for f in table.schema}
    assert pa.types.is_struct(types["customer"]) and pa.types.is_list(types["lines"])
    assert pa.types.is_map(types["attrs"])
    assert types["placed"] == pa.timestamp("us", "UTC")  # TIMESTAMP_MICROS, as UTC
    assert types["id"] == pa.int64()
    if fmt == "avro":
        assert types["total"] == pa.decimal128(10, 2)
    if fmt != "protobuf":
        assert types["day"] == pa.date32() and types["note"] == pa.string()
    rows = sorted(table.to_pylist(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(RECORDS))
    third = rows[3]
    assert third["customer"] == {"name": "c0", "tier": "GOLD"}
    assert third["lines"] == [{"sku": "s3", "qty": 3}]
    assert third["attrs"] == [("channel", "web")]
    assert third["placed"] == PLACED + dt.timedelta(seconds=3)
    if fmt == "avro":
        assert third["total"] == Decimal("3.25") and third["day"] == PLACED.date()
        assert rows[2]["note"] == "n2" and third["note"] is None
    if fmt == "protobuf":
        assert third["blob"] == bytes([3, 1])

    spark_types = {
        f.name: f.dataType.simpleString() for f in spark.read.parquet(str(path)).schema.fields
    }
    for name, expected in EXPECTED_SPARK[fmt].items():
        assert spark_types[name] == expected, (name, spark_types)
    assert read_all(kafka_broker.bootstrap, dlq) == []


# Version 3: ``amount`` becomes a string, an incompatible change for the table (the registry
# may take it: compatibility is checked per subject, and a producer may use another one).
ORDER_AVRO_V3 = {
    **ORDER_AVRO,
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "item", "type": "string"},
        {"name": "amount", "type": "string"},
    ],
}


def test_a_new_optional_field_adds_a_column_and_a_type_change_stops_naming_field_and_ids(
    kafka_broker: KafkaBroker,
    schema_registry: ApicurioRegistry,
    topic_factory: Any,
    spark: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="offtake")
    src, dlq = topic_factory(), topic_factory()
    v1 = serializer("avro", schema_registry.url, src)
    v2 = serializer("avro", schema_registry.url, src, ORDER_AVRO_V2)
    first = [v1(order(i)) for i in range(10)]
    first += [v2({**order(i), "note": f"n{i}"}) for i in range(10, 20)]
    produce(kafka_broker.bootstrap, src, first)
    path = tmp_path / "table"
    doc = _doc("avro", kafka_broker.bootstrap, src, path, schema_registry, dlq)
    group = doc["spec"]["source"]["groupId"]
    running = EngineThread(doc, spark)
    try:
        wait_caught_up(kafka_broker.bootstrap, group, src, 1)
        table = _table(path)
        rows = sorted(table.to_pylist(), key=lambda r: r["id"])
        assert [r["id"] for r in rows] == list(range(20))  # no row lost to the new column
        assert table.schema.field("note").type == pa.string()
        assert table.schema.field("amount").type == pa.float64()
        assert [r["note"] for r in rows] == [None] * 10 + [f"n{i}" for i in range(10, 20)]
        merged = spark.read.option("mergeSchema", "true").parquet(str(path))
        assert merged.filter("note IS NULL").count() == 10

        # Different subject, so the registry's own compatibility check lets it through.
        v3 = serializer("avro", schema_registry.url, f"{src}-other", ORDER_AVRO_V3)
        bad = [v3({**order(i), "amount": str(i)}) for i in range(20, 25)]
        produce(kafka_broker.bootstrap, src, bad)
        deadline = time.monotonic() + 120
        while running.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        code = running.stop()
    assert code == EXIT_STOPPED_ON_ERROR
    halted = [r.getMessage() for r in caplog.records if "the sink halted" in r.getMessage()]
    assert halted, [r.getMessage() for r in caplog.records]
    reason = halted[0]
    v1_id = int.from_bytes(first[0][1:5], "big")
    v3_id = int.from_bytes(bad[0][1:5], "big")
    assert "incompatible schema change" in reason and "'amount'" in reason, reason
    assert f"schema id {v3_id}" in reason and f"schema id {v1_id}" in reason, reason
    assert "errors.policy" not in reason
    assert committed(kafka_broker.bootstrap, group, src, 1)[0] == 20  # nothing past it
    assert read_all(kafka_broker.bootstrap, dlq) == []  # not the records' fault
    assert sorted(r["id"] for r in _table(path).to_pylist()) == list(range(20))

    # Restarted (as Kubernetes restarts the pod): the new worker checks the records against
    # the table's columns, not only against what it wrote itself, and stops again.
    caplog.clear()
    again = EngineThread(doc, spark)
    again.thread.join(120)
    assert again.code == EXIT_STOPPED_ON_ERROR
    assert any(
        "'amount'" in r.getMessage() and "written before this worker started" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    assert committed(kafka_broker.bootstrap, group, src, 1)[0] == 20
    assert sorted(r["id"] for r in _table(path).to_pylist()) == list(range(20))
    assert read_all(kafka_broker.bootstrap, dlq) == []
