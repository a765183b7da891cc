"""Parquet and JSON sinks on a real local Spark: every record exactly once, even when batches
are written again after a crash (same bounds or other bounds)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from offtake.metrics import Metrics
from offtake.sinks.base import SinkBatch, SinkError
from offtake.sinks.spark import SparkSink
from offtake.sinks.spark.batching import BatchId
from offtake.sinks.spark.fileops import HadoopFileOps
from offtake.sinks.spark.writers import FileWriter, batch_of_file, staging_root

from .readers import META, json_rows_everywhere, read_everywhere
from .support import Collector, item, items, metric, pipeline, run_sink

pytestmark = pytest.mark.spark


def _offsets(spark: Any, fmt: str, path: Path) -> list[tuple[int, int]]:
    rows = spark.read.format(fmt).load(str(path)).select("partition", "offset").collect()
    return sorted((r["partition"], r["offset"]) for r in rows)


@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_batches_written_then_rewritten_leave_each_record_once(
    spark: Any, tmp_path: Path, fmt: str
) -> None:
    path = tmp_path / "table"
    spec = pipeline({"format": fmt, "path": str(path), "batch": {"maxRecords": 300}})
    records = items(range(1000)) + items(range(400), partition=1)
    done, _ = run_sink(spec, spark, [records])
    assert len(done.ok) == 1400 and not done.failed
    expected = [(0, o) for o in range(1000)] + [(1, o) for o in range(400)]
    assert _offsets(spark, fmt, path) == expected

    # The crash: every job succeeded but no offset was committed, so a restarted worker
    # reads the same records again: once with the same bounds, once cut elsewhere.
    run_sink(spec, spark, [items(range(1000))])
    assert _offsets(spark, fmt, path) == expected
    # Restarted from a commit (a batch end) and cut into other batches this time.
    other = pipeline({"format": fmt, "path": str(path), "batch": {"maxRecords": 450}})
    run_sink(other, spark, [items(range(300, 1000))])
    assert _offsets(spark, fmt, path) == expected
    run_sink(other, spark, [items(range(1000))])
    assert _offsets(spark, fmt, path) == expected

    # The table is the record's columns and the documented Kafka metadata, nothing else
    # (no column, folder or file of the sink's own), and only data files named by batch.
    # (Spark's JSON reader sorts the columns it infers, so compare them as a set.)
    df = spark.read.format(fmt).load(str(path))
    columns = ["topic", "partition", "offset", "timestamp", "key", "id", "amount", "customer"]
    assert (df.columns if fmt == "parquet" else sorted(df.columns)) == (
        columns if fmt == "parquet" else sorted(columns)
    )
    names = os.listdir(path)
    assert names and all(batch_of_file(n) for n in names), names
    assert all(n.endswith(f".{fmt}") for n in names), names
    assert os.listdir(staging_root(str(path))) == []  # no staged leftovers
    if fmt == "json":  # JSON lines files, which the usual readers take as they are
        assert set(json_rows_everywhere(path, spark).values()) == {1400}


def test_batches_of_several_partitions_written_in_one_job_land_each_once(
    spark: Any, tmp_path: Path
) -> None:
    """Batches queued for several partitions share one Spark job (the job's fixed cost paid
    once); each still lands under its own name, and the job's batch column in no file."""
    path = tmp_path / "table"
    spec = pipeline({"format": "parquet", "path": str(path), "batch": {"maxRecords": 500}})
    records = [it for p in range(4) for it in items(range(500), partition=p)]
    metrics = Metrics("t")
    done, _ = run_sink(spec, spark, [records], metrics=metrics)
    assert len(done.ok) == 2000 and not done.failed
    # One job per partition without combining; here the batches queued before the job thread
    # took the first (one job), or the first ran alone and the other three together (two).
    assert metric(metrics, "offtake_spark_jobs_total", result="success") <= 2
    names = sorted(os.listdir(path))
    assert sorted({str(batch_of_file(n)) for n in names}) == [
        f"orders-{p}-0-499" for p in range(4)
    ], names
    for read in read_everywhere(path, spark):
        assert read.rows == 2000 and len(read.positions) == 2000, (
            read
        )  # each (partition, offset) once
        assert not [c for c in read.columns if c.startswith("_offtake")], read
    # Written again after a crash (nothing committed): still each record once.
    run_sink(spec, spark, [records])
    assert _offsets(spark, "parquet", path) == [(p, o) for p in range(4) for o in range(500)]
    assert os.listdir(staging_root(str(path))) == []


def test_several_batches_of_one_partition_in_one_job_land_in_offset_order_each_once(
    spark: Any, tmp_path: Path
) -> None:
    """A partition's full batches and its short tail queue behind a running job and share the
    next one: each lands under its own name, once, and a rerun (nothing committed) replaces
    them all."""
    path = tmp_path / "table"
    spec = pipeline({"format": "parquet", "path": str(path), "batch": {"maxRecords": 300}})
    records = items(range(901)) + items(range(300), partition=1)
    jobs: list[list[str]] = []

    class Recording(FileWriter):
        def write(self, df: Any, batch: BatchId, still_owned: Any) -> None:
            jobs.append([str(batch)])  # a job of one batch
            super().write(df, batch, still_owned)

        def write_batches(self, df: Any, batches: Any, still_owned: Any) -> list[BatchId]:
            jobs.append([str(b) for b in batches])
            return super().write_batches(df, batches, still_owned)

    table_listings: list[str] = []

    class CountingFileOps(HadoopFileOps):
        def walk(self, where: str) -> list[str]:
            if where == str(path):
                table_listings.append(where)
            return super().walk(where)

    writer = Recording("parquet", str(path), (), CountingFileOps(spark))
    done, _ = run_sink(spec, spark, [records], writer=writer)
    assert len(done.ok) == 1201 and not done.failed
    # The table is listed once per job (a call per file through py4j), not once per batch.
    assert len(table_listings) == len(jobs), (table_listings, jobs)
    # The first job starts with what is queued when the job thread wakes; what queues behind
    # it shares the next one. Each batch in one job, each partition's in offset order.
    batches = ["orders-0-0-299", "orders-0-300-599", "orders-0-600-899", "orders-0-900-900"]
    assert sorted(b for job in jobs for b in job) == sorted([*batches, "orders-1-0-299"]), jobs
    for job in jobs:
        starts = [BatchId.parse(b).start for b in job if b.startswith("orders-0-")]
        assert starts == sorted(starts), jobs
    assert any(sum(b.startswith("orders-0-") for b in job) >= 2 for job in jobs), jobs
    names = sorted(os.listdir(path))
    assert sorted({str(batch_of_file(n)) for n in names}) == [
        "orders-0-0-299",
        "orders-0-300-599",
        "orders-0-600-899",
        "orders-0-900-900",
        "orders-1-0-299",
    ], names
    expected = [(0, o) for o in range(901)] + [(1, o) for o in range(300)]
    assert _offsets(spark, "parquet", path) == expected
    run_sink(spec, spark, [records])
    assert _offsets(spark, "parquet", path) == expected


def test_a_rewind_into_a_written_batch_loses_nothing(spark: Any, tmp_path: Path) -> None:
    """A rewind to the middle of a written batch must not delete the rows below the rewind
    point (they may be committed): that batch is kept, so its tail may appear twice."""
    path = tmp_path / "table"
    spec = pipeline({"format": "parquet", "path": str(path), "batch": {"maxRecords": 300}})
    run_sink(spec, spark, [items(range(900))])
    run_sink(spec, spark, [items(range(150, 900))])
    got = [o for _, o in _offsets(spark, "parquet", path)]
    assert set(got) == set(range(900))
    assert sorted(o for o in set(got) if got.count(o) > 1) == list(range(150, 300))


def test_partition_by_and_transform_run_in_spark(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "t"
    spec = pipeline(
        {
            "format": "parquet",
            "path": str(path),
            "partitionBy": ["customer"],
            "transform": "tests.spark.transforms:double_amount",
            "sql": "SELECT *, upper(customer) AS customer_uc FROM batch",
            "batch": {"maxRecords": 50},
        }
    )
    done, _ = run_sink(spec, spark, [items(range(120))])
    assert len(done.ok) == 120
    df = spark.read.parquet(str(path))
    rows = {r["offset"]: r for r in df.collect()}
    assert len(rows) == 120
    assert rows[7]["amount"] == 7 * 1.5 * 2 and rows[7]["customer_uc"] == "C0"
    # partitionBy folders directly under the path, holding the batches' files.
    folders = os.listdir(path)
    assert folders and all(f.startswith("customer=") for f in folders), folders
    assert all(batch_of_file(f.name) for f in path.glob("customer=*/*")), list(path.rglob("*"))


def test_failing_transform_retries_then_completes_every_item_with_the_error(
    spark: Any, tmp_path: Path
) -> None:
    spec = pipeline(
        {
            "format": "parquet",
            "path": str(tmp_path / "t"),
            "transform": "tests.spark.transforms:broken",
            "batch": {"maxRecords": 10},
        },
        errors={
            "policy": "dlq",
            "dlq": {"topic": "dlq"},
            "maxRetries": 2,
            "retryBackoffSeconds": 0.05,
        },
    )
    metrics = Metrics("test")
    done, _ = run_sink(spec, spark, [items(range(10))], timeout=120, metrics=metrics)
    assert done.ok == []
    assert len(done.failed) == 10
    err = done.failed[0][1]
    assert isinstance(err, SinkError)
    assert "orders-0-0-9" in str(err) and "3 attempt" in str(err) and "bad column" in str(err)
    assert {it.attempts for it, _ in done.failed} == {3}
    assert metric(metrics, "offtake_spark_jobs_total", result="retry") == 2
    assert metric(metrics, "offtake_spark_jobs_total", result="failure") == 1
    assert metric(metrics, "offtake_spark_jobs_total", result="success") == 0
    assert not (tmp_path / "t").exists() or not list((tmp_path / "t").rglob("part-*"))


def test_settlements_fire_on_the_engine_thread_and_metrics_count(
    spark: Any, tmp_path: Path
) -> None:
    spec = pipeline(
        {
            "format": "parquet",
            "path": str(tmp_path / "t"),
            "batch": {"maxRecords": 10_000, "maxIntervalSeconds": 0.5},
        }
    )
    metrics = Metrics("test")
    sink = SparkSink(spec, metrics, session=spark)
    done = Collector()
    sink.start(done)
    for it in items(range(25)):
        sink.submit(SinkBatch.of([it]))
    assert done.count == 0  # settlements fire only inside poll or drain
    import time

    deadline = time.monotonic() + 120
    while done.count < 25 and time.monotonic() < deadline:
        sink.poll()  # the interval bound closes the batch; poll settles them
        time.sleep(0.05)
    sink.close()
    assert len(done.ok) == 25
    assert done.threads == {"MainThread"}
    assert metric(metrics, "offtake_spark_jobs_total", result="success") == 1
    assert metric(metrics, "offtake_spark_batch_records_sum") == 25
    assert metric(metrics, "offtake_spark_last_success_timestamp_seconds") > 0


def test_dropped_records_complete_without_rows(spark: Any, tmp_path: Path) -> None:
    spec = pipeline({"format": "parquet", "path": str(tmp_path / "t")})
    it = item(0)._replace(values=[])  # the processor dropped it
    done, _ = run_sink(spec, spark, [[it]])
    assert len(done.ok) == 1


class _KilledMidMove(Exception):
    pass


class _MovesThenDies:
    """The worker's file operations, dying after ``moves`` file moves: what a SIGKILL in the
    middle of moving a batch's files into the table leaves behind (a kill is too quick to
    land there on purpose; the Kafka crash tests kill while a batch is staged)."""

    def __init__(self, inner: Any, moves: int) -> None:
        self.inner, self.left = inner, moves

    def move_file(self, src: str, dst: str) -> None:
        if self.left == 0:
            raise _KilledMidMove(f"killed before moving {src}")
        self.left -= 1
        self.inner.move_file(src, dst)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_crash_while_moving_files_in_then_a_rewrite_cut_elsewhere_lands_once_for_every_reader(
    spark: Any, tmp_path: Path
) -> None:
    path = tmp_path / "t"
    fields = {"format": "parquet", "path": str(path), "partitionBy": ["customer"]}
    errors = {"policy": "skip", "maxRetries": 0, "retryBackoffSeconds": 0.01}
    spec = pipeline({**fields, "batch": {"maxRecords": 100}}, errors=errors)
    # One batch of 100 records over 7 customers: 7 files, of which 3 reach the table.
    writer = FileWriter(
        "parquet", str(path), ("customer",), _MovesThenDies(HadoopFileOps(spark), 3)
    )
    done, _ = run_sink(spec, spark, [items(range(100))], timeout=120, writer=writer)
    assert len(done.failed) == 100 and "killed before moving" in str(done.failed[0][1])
    partial = [f for f in path.rglob("part-*") if f.is_file()]
    assert len(partial) == 3
    assert 0 < pq.read_table(path).num_rows < 100  # a reader meanwhile sees part of the batch
    assert len(os.listdir(staging_root(str(path)))) == 1  # the rest is still staged

    # The restarted worker reads the 100 records again and cuts them into other batches.
    again = pipeline({**fields, "batch": {"maxRecords": 40}}, errors=errors)
    done, _ = run_sink(again, spark, [items(range(100))])
    assert len(done.ok) == 100
    assert os.listdir(staging_root(str(path))) == []
    reads = read_everywhere(path, spark)
    print("REPORT", {r.reader: r.rows for r in reads})
    for r in reads:
        assert r.rows == 100 and r.duplicated == 0 and set(r.ids) == set(range(100)), r
        # The partitionBy column comes back from the folder names (hive partitioning), last;
        # pyarrow.dataset reads folder names only when told (partitioning="hive").
        tail = [] if r.reader == "pyarrow.dataset" else ["customer"]
        assert r.columns == [*META, "id", "amount", *tail], r
    assert all(batch_of_file(f.name) for f in path.rglob("*") if f.is_file())
