"""Iceberg sink: one Iceberg commit per batch, its snapshot summary naming the batch, so a
batch written again (whole or cut elsewhere) lands once. Read back with pyiceberg and DuckDB."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from offtake.config import ConfigError
from offtake.metrics import Metrics
from offtake.records import TopicPartition
from offtake.sinks.spark.iceberg import IcebergError, IcebergTable, written_through

from .iceberg_readers import batch_summaries, ids_by_reader, load_table
from .support import item, items, metric, password_checked_role, pipeline, run_sink


def test_written_through_is_the_newest_snapshot_of_the_partition() -> None:
    summaries = [
        {"offtake.topic": "orders", "offtake.partition": "1", "offtake.offsets": "40-59"},
        {"offtake.topic": "orders", "offtake.partition": "0", "offtake.offsets": "10-19"},
        {"offtake.topic": "orders", "offtake.partition": "0", "offtake.offsets": "0-9"},
        {"operation": "append"},
    ]
    assert written_through(summaries, TopicPartition("orders", 0)) == 19
    assert written_through(summaries, TopicPartition("orders", 1)) == 59
    assert written_through(summaries, TopicPartition("orders", 2)) is None
    assert written_through(summaries, TopicPartition("other", 0)) is None


ICEBERG = {"table": "lake.orders", "catalogUri": "sqlite://"}


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"format": "iceberg", "path": "/lake"}, "sink.spark.iceberg"),
        ({"format": "parquet", "path": "/lake", "iceberg": ICEBERG}, "sink.spark.iceberg"),
        (
            {"format": "iceberg", "path": "/lake", "iceberg": ICEBERG, "partitionBy": ["c"]},
            "sink.spark.partitionBy",
        ),
        (
            {"format": "iceberg", "path": "/lake", "iceberg": {**ICEBERG, "table": "orders"}},
            "sink.spark.iceberg.table",
        ),
    ],
)
def test_iceberg_fields_are_checked_with_their_names(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(named)):
        pipeline(fields)


def test_the_catalog_password_comes_from_its_secret_ref(
    postgres: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """iceberg.passwordSecretRef: catalogUri holds no password; the worker puts
    $OFFTAKE_ICEBERG_CATALOG_PASSWORD into it when it opens the catalog, in a PostgreSQL that
    checks passwords (a wrong one fails naming the field, the right one creates the catalog)."""
    uri = f"postgresql+psycopg://ice_writer@127.0.0.1:{postgres.port}/{postgres.database}"
    iceberg = {**ICEBERG, "catalogUri": uri, "passwordSecretRef": {"name": "c", "key": "pw"}}
    spec = pipeline({"format": "iceberg", "path": str(tmp_path), "iceberg": iceberg})
    assert spec.sink.spark is not None and spec.sink.spark.iceberg is not None
    with password_checked_role(postgres, "ice_writer", "p@ss/w0rd"):
        monkeypatch.setenv("OFFTAKE_ICEBERG_CATALOG_PASSWORD", "wrong")
        with pytest.raises(IcebergError, match=re.escape("sink.spark.iceberg.catalogUri")) as err:
            IcebergTable(spec.sink.spark.iceberg, str(tmp_path)).catalog()
        assert "wrong" not in str(err.value)
        monkeypatch.setenv("OFFTAKE_ICEBERG_CATALOG_PASSWORD", "p@ss/w0rd")
        catalog = IcebergTable(spec.sink.spark.iceberg, str(tmp_path)).catalog()
        try:
            catalog.create_namespace_if_not_exists("secretref")
            assert ("secretref",) in catalog.list_namespaces()
            catalog.drop_namespace("secretref")
        finally:
            # The catalog's own tables go too: the database is the JDBC tests', which count
            # the tables of its public schema (every staging table dropped).
            catalog.destroy_tables()
            catalog.engine.dispose()


def _iceberg_sink(tmp_path: Path, max_records: int) -> tuple[str, str, dict[str, Any]]:
    """A SQLite catalog's URI, the warehouse and the sink.spark fields of an Iceberg table."""
    uri = f"sqlite:///{tmp_path / 'catalog.db'}"
    warehouse = str(tmp_path / "lake")
    fields = {
        "format": "iceberg",
        "path": warehouse,
        "iceberg": {"table": "lake.orders", "catalogUri": uri},
        "batch": {"maxRecords": max_records, "maxIntervalSeconds": 60},
    }
    return uri, warehouse, fields


@pytest.mark.spark
def test_iceberg_batches_written_again_land_once(spark: Any, tmp_path: Path) -> None:
    uri, warehouse, fields = _iceberg_sink(tmp_path, max_records=250)
    done, _ = run_sink(pipeline(fields), spark, [items(range(1000))])
    assert (len(done.ok), len(done.failed)) == (1000, 0)
    # The same records again, cut at other offsets from the middle of a batch (a restart
    # from an older commit), and more after them.
    again = pipeline({**fields, "batch": {"maxRecords": 400, "maxIntervalSeconds": 60}})
    done, _ = run_sink(again, spark, [items(range(100, 1300))])
    assert (len(done.ok), len(done.failed)) == (1200, 0)
    table = load_table(uri, warehouse, "lake.orders")
    for reader, ids in ids_by_reader(table).items():
        assert ids == Counter(range(1300)), reader
    summaries = batch_summaries(table)
    # Four batches of 250; of the second run's 100-499, 500-899 and 900-1299 only the part
    # past 999 is new: one commit.
    assert [s["offtake.offsets"] for s in summaries] == [
        "0-249",
        "250-499",
        "500-749",
        "750-999",
        "1000-1299",
    ]
    assert {s["offtake.topic"] for s in summaries} == {"orders"}
    assert {s["offtake.partition"] for s in summaries} == {"0"}


@pytest.mark.spark
def test_batches_of_several_partitions_share_a_job_and_commit_each(
    spark: Any, tmp_path: Path
) -> None:
    """One Spark job writes the queued batches of every partition; each is still its own
    Iceberg commit naming its partition and offsets, and a rewrite lands once."""
    uri, warehouse, fields = _iceberg_sink(tmp_path, max_records=300)
    # Ids unique across partitions: partition p holds ids p*1000 ... p*1000+299.
    records = [
        item(o, {"id": p * 1000 + o, "amount": 1.5, "customer": "c"}, partition=p)
        for p in range(3)
        for o in range(300)
    ]
    metrics = Metrics("t")
    done, _ = run_sink(pipeline(fields), spark, [records], metrics=metrics)
    assert (len(done.ok), len(done.failed)) == (900, 0)
    assert metric(metrics, "offtake_spark_jobs_total", result="success") <= 2
    done, _ = run_sink(pipeline(fields), spark, [records])  # a crash before the offset commit
    assert (len(done.ok), len(done.failed)) == (900, 0)
    table = load_table(uri, warehouse, "lake.orders")
    expected = Counter(p * 1000 + o for p in range(3) for o in range(300))
    for reader, ids in ids_by_reader(table).items():
        assert ids == expected, reader
    summaries = batch_summaries(table)
    assert sorted((s["offtake.partition"], s["offtake.offsets"]) for s in summaries) == [
        ("0", "0-299"),
        ("1", "0-299"),
        ("2", "0-299"),
    ]
