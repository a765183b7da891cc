"""The Spark sink through real ``offtake worker`` processes on a real Kafka broker (issue 5).

Each crash test produces JSON records, starts a worker with ``sink.spark``, SIGKILLs the
worker's whole process tree (the Python worker and its Spark JVM, as when a pod's container is
killed) while a batch is being written and after an earlier batch was written but not yet
committed, restarts it, waits until the group's committed offsets reach the log end and then
reads the sink: every record id must be there exactly once. The parquet table is read with
every reader its users use (pandas, pyarrow, DuckDB, Polars, Spark; tests/spark/readers.py),
each of which must count every record once and see only the documented columns; the Iceberg
table is read with pyiceberg and DuckDB, the Delta table with delta-rs (``deltalake``). Each test
prints a ``REPORT`` line (json; appended to ``$OFFTAKE_REPORT`` when set) with rows written
against records produced, per reader for parquet.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.reports import lost_and_duplicated, report
from support.workers import (
    WorkerProcess,
    committed,
    committed_records,
    end_offsets,
    manifest,
    produce,
    read_all,
    wait_caught_up,
    write_manifest,
)

from offtake.sinks.spark.writers import BATCH_COLUMN, batch_of_file, staging_root
from offtake_testbed.kafka import KafkaBroker

from .connect_server import ConnectServer
from .iceberg_readers import batch_summaries, ids_by_reader, load_table
from .readers import META, read_everywhere

pytestmark = pytest.mark.spark

# Keep each worker's Spark light: this machine has two cores for Kafka, Spark and the tests.
SPARK_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
BATCH = {"maxRecords": 2000, "maxIntervalSeconds": 2}
PARTITIONS = 4
RECORDS = 20_000
# The first run never reaches a commit tick (an hour), so every batch it wrote before the
# kill is written but not committed: the restarted worker has to write each one again (the
# effectively-once case). A shorter interval raced on a slow machine: the tick could commit the
# written batch before the next one started staging. The restart commits every second.
FIRST_RUN_COMMIT = {"intervalSeconds": 3600.0}
RESTART_COMMIT = {"intervalSeconds": 1.0}
# Nor an early commit (a quarter of maxInFlightMessages done, which one Spark job writing the
# batches of all four partitions reaches): the crash tests need the first run's batches written
# and not committed.
NO_EARLY_COMMIT = {"maxInFlightMessages": 100_000}


def value(i: int) -> dict[str, Any]:
    return {"id": i, "customer": f"c{i % 7}", "amount": i * 0.5}


def spark_sink(master: str = "local[1]", **fields: Any) -> dict[str, Any]:
    return {
        "spark": {
            **fields,
            "batch": dict(BATCH),
            "submit": {"mode": "local", "master": master, "conf": dict(SPARK_CONF)},
        }
    }


# -- processes -------------------------------------------------------------------------------
def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name (field 2) may hold spaces; the parent pid follows its ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int) -> list[int]:
    tree, out, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def kill_tree(worker: WorkerProcess) -> None:
    """SIGKILL the worker and every process under it at once, as a killed container would."""
    assert worker.proc is not None
    pids = [worker.proc.pid, *descendants(worker.proc.pid)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    worker.wait(30)
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids[1:]):
        assert time.monotonic() < deadline, f"processes survived SIGKILL: {pids}"
        time.sleep(0.1)


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    """Workers a test starts; any still running at the end (a failed test) are killed."""
    started: list[WorkerProcess] = []
    yield started
    for w in started:
        if w.proc is not None and w.proc.poll() is None:
            kill_tree(w)


def start(workers: list[WorkerProcess], path: Path, log: Path, **env: str) -> WorkerProcess:
    w = WorkerProcess(path, log, env=dict(env)).start()
    workers.append(w)
    return w


@contextlib.contextmanager
def own_database(postgres: Any, prefix: str) -> Iterator[str]:
    """A database of the test's own in the test bed's PostgreSQL, which the other JDBC tests
    share (they check tables of theirs); dropped after, connections and all."""
    database = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres.dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {database}")
    try:
        yield database
    finally:
        with psycopg.connect(postgres.dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def reader_numbers(produced: int, ids: Counter[int]) -> dict[str, int]:
    """What one reader saw against what was produced: lost, duplicated and rows."""
    lost, duplicated = lost_and_duplicated(produced, ids)
    return {"lost": lost, "duplicated": duplicated, "rows": sum(ids.values())}


# -- the crash, for any sink ----------------------------------------------------------------
def crash_and_recover(
    *,
    bootstrap: str,
    topic: str,
    doc: dict[str, Any],
    tmp_path: Path,
    workers: list[WorkerProcess],
    mid_batch: Callable[[], bool],
    rows_written: Callable[[], int],
    patience: float = 1.0,
) -> dict[str, Any]:
    """Kill the worker while ``mid_batch()``, restart it, wait until the group caught up.

    Returns the numbers observed at the kill. ``rows_written()`` counts the rows the sink
    holds now (only swapped-in batches, never staged ones).
    """
    first_doc = json.loads(json.dumps(doc))
    first_doc["spec"]["commit"] = dict(FIRST_RUN_COMMIT)
    first_path = write_manifest(tmp_path / "first-run.yaml", first_doc)
    doc["spec"]["commit"] = dict(RESTART_COMMIT)
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    group = doc["spec"]["source"]["groupId"]
    began = time.monotonic()
    first = start(workers, first_path, tmp_path / "first.log")
    first.wait_until(
        mid_batch,
        "batch in the middle of its write after an earlier batch",
        timeout=180 * patience,
    )
    kill_tree(first)
    at_kill = time.monotonic() - began
    committed_at_kill = committed_records(bootstrap, group, topic, PARTITIONS)
    written_before_restart = rows_written()
    ends = end_offsets(bootstrap, topic, PARTITIONS)
    assert committed_at_kill < sum(ends.values()), "the kill must land before the group caught up"
    # A batch written but not committed: the restarted worker reads its records again, and
    # writing them again must not leave a second copy.
    assert written_before_restart > committed_at_kill, (
        f"the kill must land after a batch was written and before it was committed "
        f"(written {written_before_restart}, committed {committed_at_kill})"
    )
    second = start(workers, path, tmp_path / "second.log")
    wait_caught_up(bootstrap, group, topic, PARTITIONS, timeout=240 * patience)
    caught_up = time.monotonic() - began
    assert second.terminate() == 0, second.output()[-4000:]
    return {
        "killed_after_seconds": round(at_kill, 1),
        "rows_written_before_kill": written_before_restart,
        "committed_at_kill": committed_at_kill,
        "caught_up_after_seconds": round(caught_up, 1),
    }


# -- parquet ----------------------------------------------------------------------------------
def _data_files(path: Path) -> list[str]:
    """The table's data files (relative paths), whose names carry their batch's identity."""
    if not path.exists():
        return []
    return [
        str(f.relative_to(path)) for f in path.rglob("*") if f.is_file() and batch_of_file(f.name)
    ]


def _batches(path: Path) -> int:
    return len({batch_of_file(Path(f).name) for f in _data_files(path)})


def _staged(path: Path) -> list[str]:
    staging = Path(staging_root(str(path)))
    return os.listdir(staging) if staging.exists() else []


def _rows_in_table(path: Path) -> int:
    """Rows in the table now (only moved-in files, never staged ones)."""
    import pyarrow.dataset as ds

    return ds.dataset(path).count_rows() if _data_files(path) else 0


@pytest.mark.parametrize("partition_by", [(), ("customer",)], ids=["flat", "partitionBy"])
def test_parquet_sigkill_mid_batch_then_restart_leaves_every_record_once_for_every_reader(
    partition_by: tuple[str, ...],
    kafka_broker: KafkaBroker,
    topic_factory: Any,
    spark: Any,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    topic = topic_factory(PARTITIONS)
    table = tmp_path / "table"
    produced = produce(kafka_broker.bootstrap, topic, (value(i) for i in range(RECORDS)))
    name = "spark-crash-parquet" + ("-partitioned" if partition_by else "")
    fields: dict[str, Any] = {"format": "parquet", "path": str(table)}
    if partition_by:
        fields["partitionBy"] = list(partition_by)
    doc = manifest(name, kafka_broker.bootstrap, [topic], sink=spark_sink(**fields))
    doc["spec"]["limits"] = dict(NO_EARLY_COMMIT)
    numbers = crash_and_recover(
        bootstrap=kafka_broker.bootstrap,
        topic=topic,
        doc=doc,
        tmp_path=tmp_path,
        workers=workers,
        # One batch moved into the table and the next one being written to its staging folder.
        mid_batch=lambda: bool(_data_files(table)) and bool(_staged(table)),
        rows_written=lambda: _rows_in_table(table),
    )
    # What a user would do next: point pandas, pyarrow, DuckDB, Polars or Spark at the path.
    reads = read_everywhere(table, spark)
    leftovers = _staged(table)
    per_reader = {r.reader: reader_numbers(produced, r.ids) | {"rows": r.rows} for r in reads}
    report(
        name,
        produced=produced,
        rows_written=reads[-1].rows,
        readers=per_reader,
        batches=_batches(table),
        staging_leftovers=len(leftovers),
        **numbers,
    )
    for r in reads:
        assert per_reader[r.reader] == {"lost": 0, "duplicated": 0, "rows": produced}, r
        # Kafka metadata rode along: each (partition, offset) once, matching the log.
        assert len(r.positions) == produced, r
        # The record's columns and the documented metadata, nothing of the sink's own; a
        # partitionBy column comes back last from the folder names (customer=c3), except in
        # pyarrow.dataset, which reads folder names only with partitioning="hive".
        if not partition_by:
            assert r.columns == [*META, "id", "customer", "amount"], r
        elif r.reader == "pyarrow.dataset":
            assert r.columns == [*META, "id", "amount"], r
        else:
            assert r.columns == [*META, "id", "amount", "customer"], r
    # The staged folder of the killed job belonged to a batch the restart replaced.
    assert leftovers == []
    files = sorted(str(f.relative_to(table)) for f in table.rglob("*") if f.is_file())
    assert files == sorted(_data_files(table)), "only data files in the table"
    if partition_by:
        assert all(f.startswith("customer=") for f in os.listdir(table))


# -- iceberg ----------------------------------------------------------------------------------
def _iceberg_mid_batch(warehouse: Path) -> bool:
    """A batch committed to Iceberg and another one's files staged in no snapshot yet.

    Read from the files alone (cheap enough to poll fast): each commit writes one metadata
    file after the table's first. A job's files go to one ``offtake-<batch>`` folder, with a
    ``_offtake_batch=<n>`` folder per batch when the job wrote several (every queued batch
    shares a job: here, after the JVM start, all the first run's batches), then the batches
    are committed one by one: the kill lands between two of those commits.
    """
    tables = list(warehouse.glob("*/*"))
    if not tables:
        return False
    commits = len(list((tables[0] / "metadata").glob("*.metadata.json"))) - 1
    staged = sum(
        len(list(job.glob(f"{BATCH_COLUMN}=*"))) or 1
        for job in (tables[0] / "data").glob("offtake-*")
    )
    return commits > 0 and staged > commits


def _iceberg_rows(uri: str, warehouse: Path, name: str) -> int:
    from pyiceberg.exceptions import NoSuchTableError

    try:
        snapshot = load_table(uri, str(warehouse), name).current_snapshot()
    except NoSuchTableError:
        return 0
    return int(snapshot.summary["total-records"]) if snapshot and snapshot.summary else 0


# Table-format commits cost seconds each (a Delta commit on a busy machine tens): the waits for
# the kill and for the catch-up get twice the file formats'.
LAKE_PATIENCE = 2.0


@pytest.mark.lake_crash
@pytest.mark.timeout(900)  # two worker starts and twenty batches: minutes on a busy machine
def test_iceberg_sigkill_mid_batch_then_restart_leaves_every_record_once(
    kafka_broker: KafkaBroker,
    topic_factory: Any,
    postgres: Any,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    topic = topic_factory(PARTITIONS)
    produced = produce(kafka_broker.bootstrap, topic, (value(i) for i in range(RECORDS)))
    warehouse = tmp_path / "lake"
    name = "lake.orders"
    with own_database(postgres, "ice") as database:
        # Iceberg's JDBC catalog in the test bed's PostgreSQL, the data files under tmp_path.
        uri = f"postgresql+psycopg://{postgres.user}@127.0.0.1:{postgres.port}/{database}"
        doc = manifest(
            "spark-crash-iceberg",
            kafka_broker.bootstrap,
            [topic],
            sink=spark_sink(
                format="iceberg", path=str(warehouse), iceberg={"table": name, "catalogUri": uri}
            ),
        )
        doc["spec"]["limits"] = dict(NO_EARLY_COMMIT)
        numbers = crash_and_recover(
            bootstrap=kafka_broker.bootstrap,
            topic=topic,
            doc=doc,
            tmp_path=tmp_path,
            workers=workers,
            # A batch committed to Iceberg (not to Kafka), the next one's files being written.
            mid_batch=lambda: _iceberg_mid_batch(warehouse),
            rows_written=lambda: _iceberg_rows(uri, warehouse, name),
            patience=LAKE_PATIENCE,
        )
        table = load_table(uri, str(warehouse), name)
        reads = ids_by_reader(table)
        summaries = batch_summaries(table)
    per_reader = {reader: reader_numbers(produced, ids) for reader, ids in reads.items()}
    report(
        "spark-crash-iceberg",
        produced=produced,
        rows_written=per_reader["pyiceberg"]["rows"],
        readers=per_reader,
        commits=len(summaries),
        **numbers,
    )
    for reader, got in per_reader.items():
        assert got == {"lost": 0, "duplicated": 0, "rows": produced}, reader
    # Every commit names its batch, and the batches of a partition never overlap.
    by_partition: dict[str, list[tuple[int, int]]] = {}
    for props in summaries:
        assert props["offtake.topic"] == topic, props
        start, end = map(int, props["offtake.offsets"].split("-"))
        by_partition.setdefault(props["offtake.partition"], []).append((start, end))
    for ranges in by_partition.values():
        assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges)), ranges


# -- delta ------------------------------------------------------------------------------------
def _delta_rows(path: Path) -> int:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return int(DeltaTable(str(path)).to_pyarrow_dataset().count_rows())
    except TableNotFoundError:
        return 0


def _delta_commits(path: Path) -> int:
    log_dir = path / "_delta_log"
    return len(list(log_dir.glob("*.json"))) if log_dir.exists() else 0


def _delta_unreferenced_files(path: Path) -> int:
    """Data files in the table folder that no commit names yet (a batch being written)."""
    named: set[str] = set()
    for entry in (path / "_delta_log").glob("*.json"):
        for line in entry.read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "add" in action:
                named.add(action["add"]["path"])
    return len({f.name for f in path.glob("*.parquet")} - named)


@pytest.mark.lake_crash
@pytest.mark.timeout(900)
def test_delta_sigkill_mid_batch_then_restart_leaves_every_record_once(
    kafka_broker: KafkaBroker,
    topic_factory: Any,
    delta_server: ConnectServer,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    from deltalake import DeltaTable

    topic = topic_factory(PARTITIONS)
    table = tmp_path / "delta"
    produced = produce(kafka_broker.bootstrap, topic, (value(i) for i in range(RECORDS)))
    doc = manifest(
        "spark-crash-delta",
        kafka_broker.bootstrap,
        [topic],
        # Delta runs on a Spark Connect server of the Spark its release is built for (see
        # delta_server.py); the SIGKILL hits the worker, as a killed pod would, not the server.
        sink={
            "spark": {
                "format": "delta",
                "path": str(table),
                "batch": dict(BATCH),
                "submit": {"mode": "connect", "connectUrl": delta_server.url},
            }
        },
    )
    doc["spec"]["limits"] = dict(NO_EARLY_COMMIT)

    def mid_batch() -> bool:
        # A batch committed to Delta, and the next one's data files being written (Delta
        # writes them into the table folder before its commit names them).
        return _delta_commits(table) > 0 and _delta_unreferenced_files(table) > 0

    numbers = crash_and_recover(
        bootstrap=kafka_broker.bootstrap,
        topic=topic,
        doc=doc,
        tmp_path=tmp_path,
        workers=workers,
        mid_batch=mid_batch,
        rows_written=lambda: _delta_rows(table),
        patience=LAKE_PATIENCE,
    )
    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["id"]).column("id").to_pylist()
    got = reader_numbers(produced, Counter(int(i) for i in rows))
    report(
        "spark-crash-delta",
        produced=produced,
        rows_written=len(rows),
        readers={"deltalake": got},
        commits=_delta_commits(table),
        **numbers,
    )
    assert got == {"lost": 0, "duplicated": 0, "rows": produced}


# -- jdbc -------------------------------------------------------------------------------------
class Postgres:
    """A probe of the sink's table over one autocommit connection (cheap to poll)."""

    def __init__(self, dsn: str, table: str) -> None:
        self.table = table
        self.conn = psycopg.connect(dsn, autocommit=True)

    def tables(self) -> list[str]:
        rows = self.conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
            "AND table_name LIKE %s",
            (f"{self.table}%",),
        ).fetchall()
        return sorted(r[0] for r in rows)

    def staging(self) -> list[str]:
        return [t for t in self.tables() if t.startswith(f"{self.table}__offtake_")]

    def rows(self) -> int:
        if self.table not in self.tables():
            return 0
        row = self.conn.execute(f"SELECT count(*) FROM {self.table}").fetchone()
        return int(row[0]) if row else 0

    def ids(self) -> Counter[int]:
        got = self.conn.execute(f"SELECT id, count(*) FROM {self.table} GROUP BY id").fetchall()
        return Counter({int(i): int(n) for i, n in got})

    def close(self) -> None:
        self.conn.close()


def test_jdbc_sigkill_mid_batch_then_restart_leaves_every_record_once(
    kafka_broker: KafkaBroker,
    topic_factory: Any,
    postgres: Any,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    topic = topic_factory(PARTITIONS)
    table = "crash_orders"
    produced = produce(kafka_broker.bootstrap, topic, (value(i) for i in range(RECORDS)))
    with own_database(postgres, "crash") as database:
        url = postgres.jdbc_url.rsplit("/", 1)[0] + f"/{database}"
        jdbc = {"url": url, "table": table, "user": postgres.user}
        doc = manifest(
            "spark-crash-jdbc",
            kafka_broker.bootstrap,
            [topic],
            sink=spark_sink(format="jdbc", jdbc=jdbc),
        )
        dsn = postgres.dsn.replace(f"dbname={postgres.database}", f"dbname={database}")
        db = Postgres(dsn, table)
        try:
            numbers = crash_and_recover(
                bootstrap=kafka_broker.bootstrap,
                topic=topic,
                doc=doc,
                tmp_path=tmp_path,
                workers=workers,
                # Rows of a swapped batch in the table, and the next batch in its staging table.
                mid_batch=lambda: bool(db.staging()) and db.rows() > 0,
                rows_written=db.rows,
            )
            counts = db.ids()
            leftovers = db.staging()
        finally:
            db.close()
    lost, duplicated = lost_and_duplicated(produced, counts)
    report(
        "spark-crash-jdbc",
        produced=produced,
        rows_written=sum(counts.values()),
        lost=lost,
        duplicated=duplicated,
        staging_leftovers=len(leftovers),
        **numbers,
    )
    assert (lost, duplicated) == (0, 0)
    assert sum(counts.values()) == produced
    assert leftovers == [], f"staging tables left behind: {leftovers}"


# -- a failing transform --------------------------------------------------------------------
_BATCH_IN_ERROR = re.compile(r"batch (\S+)-(\d+)-(\d+)-(\d+): Spark job failed after (\d+) attempt")


def _batches_named(texts: Iterable[str]) -> set[tuple[int, int, int]]:
    return {(int(m[2]), int(m[3]), int(m[4])) for t in texts for m in _BATCH_IN_ERROR.finditer(t)}


@pytest.mark.parametrize("policy", ["dlq", "stop"])
def test_failing_transform_commits_nothing_retries_then_applies_the_policy(
    policy: str,
    kafka_broker: KafkaBroker,
    topic_factory: Any,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    topic = topic_factory(1)
    dlq = topic_factory(1)
    table = tmp_path / "table"
    records = 50
    produce(kafka_broker.bootstrap, topic, (value(i) for i in range(records)))
    retries = 2
    errors: dict[str, Any] = {"policy": policy, "maxRetries": retries, "retryBackoffSeconds": 1.0}
    if policy == "dlq":
        errors["dlq"] = {"topic": dlq}
    doc = manifest(
        f"spark-failing-{policy}",
        kafka_broker.bootstrap,
        [topic],
        sink=spark_sink(
            format="parquet", path=str(table), transform="tests.spark.transforms:broken_counted"
        ),
        errors=errors,
    )
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    group = doc["spec"]["source"]["groupId"]
    attempts_file = tmp_path / "attempts"
    worker = start(workers, path, tmp_path / "w.log", OFFTAKE_TEST_ATTEMPTS_FILE=str(attempts_file))

    def attempts() -> int:
        return len(attempts_file.read_text().split()) if attempts_file.exists() else 0

    # While the job fails and is retried (backoff 1 s, then 2 s), nothing is committed past
    # the start position.
    worker.wait_until(lambda: attempts() >= 1, "first failed attempt")
    samples: list[int] = []
    while "giving up" not in worker.output() and worker.proc is not None:
        samples.append(committed(kafka_broker.bootstrap, group, topic, 1)[0])
        if worker.proc.poll() is not None:
            break
        time.sleep(0.2)
    assert len(samples) >= 3, "the retries should take seconds"
    assert all(s <= 0 for s in samples), f"committed while the batch kept failing: {samples}"

    output = worker.output()
    if policy == "stop":
        code = worker.wait(90)
        output = worker.output()
        assert code == 1, output[-4000:]
        batches = _batches_named([output])
        assert batches, f"the stop message names no batch:\n{output[-4000:]}"
        assert f"failed in sink: SinkError: batch {topic}-0-" in output
        assert "errors.policy=stop" in output
        final = committed(kafka_broker.bootstrap, group, topic, 1)[0]
        assert final == 0, "nothing of the failing batch may be committed"
        dead: list[Any] = []
    else:
        wait_caught_up(kafka_broker.bootstrap, group, topic, 1, timeout=90)
        assert worker.terminate() == 0, worker.output()[-4000:]
        output = worker.output()
        final = committed(kafka_broker.bootstrap, group, topic, 1)[0]
        dead = read_all(kafka_broker.bootstrap, dlq)
        ids = Counter(json.loads(m.value())["id"] for m in dead)
        assert ids == Counter(range(records)), "every record of the failing batch once on the DLQ"
        headers = [{k: v.decode() for k, v in m.headers()} for m in dead]
        batches = _batches_named(h["offtake.error.message"] for h in headers)
        for h in headers:
            assert h["offtake.error.stage"] == "sink"
            assert h["offtake.attempts"] == str(retries + 1)
            assert h["offtake.error.class"] == "offtake.sinks.base.SinkError"
            assert "ValueError: bad column" in h["offtake.error.message"]
            assert h["offtake.original.topic"] == topic
            offset = int(h["offtake.original.offset"])
            named = _batches_named([h["offtake.error.message"]])
            assert any(s <= offset <= e for _, s, e in named), (offset, named)
        assert final == records
    # Every batch was tried once plus maxRetries times; none was ever written.
    assert batches
    assert attempts() == (retries + 1) * len(batches)
    assert output.count("retrying in") == retries * len(batches)
    assert _data_files(table) == []
    report(
        f"spark-failing-transform-{policy}",
        records=records,
        batches=len(batches),
        attempts=attempts(),
        committed_while_failing=sorted(set(samples)),
        committed_after=final,
        dlq=len(dead),
    )


# -- connect mode -----------------------------------------------------------------------------
def test_connect_mode_worker_writes_every_record_once(
    kafka_broker: KafkaBroker,
    topic_factory: Any,
    spark: Any,
    connect_server: ConnectServer,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    topic = topic_factory(2)
    table = tmp_path / "table"
    produced = produce(kafka_broker.bootstrap, topic, (value(i) for i in range(6000)))
    doc = manifest(
        "spark-connect",
        kafka_broker.bootstrap,
        [topic],
        sink={
            "spark": {
                "format": "parquet",
                "path": str(table),
                "batch": {"maxRecords": 1000, "maxIntervalSeconds": 2},
                "submit": {
                    "mode": "connect",
                    "connectUrl": connect_server.url,
                    "conf": {"spark.sql.shuffle.partitions": "2"},
                },
            }
        },
    )
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    group = doc["spec"]["source"]["groupId"]
    began = time.monotonic()
    worker = start(workers, path, tmp_path / "w.log")
    wait_caught_up(kafka_broker.bootstrap, group, topic, 2, timeout=180)
    elapsed = time.monotonic() - began
    assert worker.proc is not None
    jvms = [p for p in descendants(worker.proc.pid) if "java" in _cmdline(p)]
    assert worker.terminate() == 0, worker.output()[-4000:]
    assert jvms == [], "connect mode must not start a JVM in the worker"
    rows = spark.read.parquet(str(table)).select("id").collect()
    counts = Counter(int(r["id"]) for r in rows)
    lost, duplicated = lost_and_duplicated(produced, counts)
    report(
        "spark-connect-mode",
        produced=produced,
        rows_written=len(rows),
        lost=lost,
        duplicated=duplicated,
        batches=_batches(table),
        caught_up_after_seconds=round(elapsed, 1),
    )
    assert (lost, duplicated) == (0, 0)
    assert "Spark session ready" in worker.output()
