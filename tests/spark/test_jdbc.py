"""JDBC sink into a real PostgreSQL: staging table, then delete + insert in one transaction."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from support.waiting import wait_for

from offtake.metrics import Metrics
from offtake.sinks.spark.batching import BatchId
from offtake.sinks.spark.errors import unavailable
from offtake.sinks.spark.jdbc import PsycopgStatements
from offtake.sinks.spark.writers import JdbcWriter

from .support import items, metric, password_checked_role, pipeline, run_sink

pytestmark = pytest.mark.spark


def _offsets(postgres: Any, table: str) -> list[tuple[int, int]]:
    with psycopg.connect(postgres.dsn) as conn:
        rows = conn.execute(f'SELECT "partition", "offset" FROM {table}').fetchall()
    return sorted((int(p), int(o)) for p, o in rows)


def _tables(postgres: Any) -> list[str]:
    with psycopg.connect(postgres.dsn) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
    return sorted(r[0] for r in rows)


def test_jdbc_batches_rewritten_after_a_crash_leave_each_record_once(
    spark: Any, postgres: Any
) -> None:
    jdbc = {"url": postgres.jdbc_url, "table": "orders_sink", "user": postgres.user}
    spec = pipeline({"format": "jdbc", "jdbc": jdbc, "batch": {"maxRecords": 300}})
    records = items(range(1000)) + items(range(400), partition=1)
    done, _ = run_sink(spec, spark, [records])
    assert len(done.ok) == 1400 and not done.failed
    expected = [(0, o) for o in range(1000)] + [(1, o) for o in range(400)]
    assert _offsets(postgres, "orders_sink") == expected

    run_sink(spec, spark, [items(range(1000))])  # the same batches again
    assert _offsets(postgres, "orders_sink") == expected
    other = pipeline({"format": "jdbc", "jdbc": jdbc, "batch": {"maxRecords": 450}})
    run_sink(other, spark, [items(range(300, 1000))])  # resumed at a commit, cut elsewhere
    assert _offsets(postgres, "orders_sink") == expected

    with psycopg.connect(postgres.dsn) as conn:
        row = conn.execute(
            'SELECT "topic", "key", "id", "amount", "customer", "_offtake_start", "_offtake_end" '
            'FROM orders_sink WHERE "partition" = 0 AND "offset" = 7'
        ).fetchone()
    assert row is not None
    assert row[:5] == ("orders", b"k7", 7, 10.5, "c0")
    assert row[5] <= 7 <= row[6]
    assert _tables(postgres) == ["orders_sink"]  # every staging table dropped


def test_jdbc_drops_staging_tables_that_a_crashed_attempt_cut_differently(
    spark: Any, postgres: Any
) -> None:
    jdbc = {"url": postgres.jdbc_url, "table": "recut_sink", "user": postgres.user}
    spec = pipeline({"format": "jdbc", "jdbc": jdbc, "batch": {"maxRecords": 300}})
    assert spec.sink.spark is not None
    names = JdbcWriter(spec.sink.spark, statements=None)  # type: ignore[arg-type]
    # What a worker killed mid-job leaves: staging tables of batches the restart cuts at
    # other end offsets (maxRecords 500 then, 300 now), for the partition it resumes and for
    # a partition it does not own.
    crashed = names.staging_table(BatchId("orders", 0, 0, 499))
    other = names.staging_table(BatchId("orders", 3, 0, 499))
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        for table in (crashed, other):
            conn.execute(f'CREATE TABLE {table} ("offset" bigint)')
            conn.execute(f"INSERT INTO {table} VALUES (1), (2)")

    done, _ = run_sink(spec, spark, [items(range(600))])

    assert len(done.ok) == 600 and not done.failed
    assert _offsets(postgres, "recut_sink") == [(0, o) for o in range(600)]
    # The resumed partition's leftover is gone; partition 3's waits for that partition's owner.
    assert [t for t in _tables(postgres) if t.startswith("recut_sink")] == sorted(
        ["recut_sink", other]
    )
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {other}")  # the other tests count the schema's tables


def test_without_a_jvm_staging_tables_are_found_through_psycopg(postgres: Any) -> None:
    # Spark Connect mode: the worker has no JVM, so listing (for the sweep) goes via psycopg.
    jdbc = {"url": postgres.jdbc_url, "table": "listed_sink", "user": postgres.user}
    spec = pipeline({"format": "jdbc", "jdbc": jdbc})
    assert spec.sink.spark is not None and spec.sink.spark.jdbc is not None
    statements = PsycopgStatements(spec.sink.spark.jdbc)
    tables = ("listed_sink", "listed_sink__offtake_aaaaaa_1", "listed_sink__offtake_bbbbbb_2")
    for table in tables:
        statements.execute(f"CREATE TABLE {table} (x int)")
    try:
        assert statements.tables(None, "LISTED_SINK__offtake_aaaaaa_") == [
            "listed_sink__offtake_aaaaaa_1"
        ]
        assert statements.tables("public", "listed_sink__offtake_bbbbbb_") == [
            "listed_sink__offtake_bbbbbb_2"
        ]
        assert statements.tables("elsewhere", "listed_sink") == []
    finally:
        for table in (
            "listed_sink",
            "listed_sink__offtake_aaaaaa_1",
            "listed_sink__offtake_bbbbbb_2",
        ):
            statements.execute(f"DROP TABLE {table}")


def test_jdbc_nested_json_is_stored_as_text(spark: Any, postgres: Any) -> None:
    jdbc = {"url": postgres.jdbc_url, "table": "nested_sink", "user": postgres.user}
    spec = pipeline({"format": "jdbc", "jdbc": jdbc})
    recs = [
        r._replace(values=[{"id": r.record.offset, "addr": {"city": "x"}, "tags": ["a", "b"]}])
        for r in items(range(3))
    ]
    done, _ = run_sink(spec, spark, [recs])
    assert len(done.ok) == 3
    with psycopg.connect(postgres.dsn) as conn:
        row = conn.execute("SELECT addr, tags FROM nested_sink WHERE id = 1").fetchone()
    assert row == ('{"city":"x"}', '["a","b"]')


def test_credentials_from_the_mounted_jdbc_secret_reach_the_database(
    postgres: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sink.spark.jdbc.secretRef: the operator mounts the Secret; the worker connects as its
    user (the files as Kubernetes writes them, a trailing newline included)."""
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS secret_writer")
        conn.execute("CREATE ROLE secret_writer LOGIN PASSWORD 'from-the-secret'")
        conn.execute("GRANT CREATE ON SCHEMA public TO secret_writer")
    (tmp_path / "username").write_text("secret_writer\n")
    (tmp_path / "password").write_text("from-the-secret\n")
    monkeypatch.setenv("OFFTAKE_JDBC_SECRET_DIR", str(tmp_path))
    jdbc = {"url": postgres.jdbc_url, "table": "owned_sink", "secretRef": {"name": "db"}}
    spec = pipeline({"format": "jdbc", "jdbc": jdbc})
    assert spec.sink.spark is not None and spec.sink.spark.jdbc is not None
    statements = PsycopgStatements(spec.sink.spark.jdbc)
    statements.execute("CREATE TABLE owned_sink (x int)")
    try:
        with psycopg.connect(postgres.dsn) as conn:
            row = conn.execute(
                "SELECT tableowner FROM pg_tables WHERE tablename = 'owned_sink'"
            ).fetchone()
        assert row == ("secret_writer",)
    finally:
        statements.execute("DROP TABLE owned_sink")


def test_a_password_secret_ref_reaches_a_database_that_checks_passwords(
    postgres: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sink.spark.jdbc.passwordSecretRef: the operator sets $OFFTAKE_JDBC_PASSWORD from the
    Secret's key (valueFrom.secretKeyRef); the worker connects with it: a wrong one is
    refused, the right one (a trailing newline included) gets in."""
    with password_checked_role(postgres, "env_writer", "from-the-env"):
        ref = {"name": "db", "key": "password"}
        jdbc = {"url": postgres.jdbc_url, "table": "env_sink", "user": "env_writer"}
        spec = pipeline({"format": "jdbc", "jdbc": {**jdbc, "passwordSecretRef": ref}})
        assert spec.sink.spark is not None and spec.sink.spark.jdbc is not None
        monkeypatch.setenv("OFFTAKE_JDBC_PASSWORD", "not-the-password")
        with pytest.raises(Exception, match="password authentication failed"):
            PsycopgStatements(spec.sink.spark.jdbc).execute("SELECT 1")
        monkeypatch.setenv("OFFTAKE_JDBC_PASSWORD", "from-the-env\n")
        statements = PsycopgStatements(spec.sink.spark.jdbc)
        statements.execute("CREATE TABLE env_sink (x int)")
        with psycopg.connect(postgres.dsn) as conn:
            owner = conn.execute(
                "SELECT tableowner FROM pg_tables WHERE tablename = 'env_sink'"
            ).fetchone()
        statements.execute("DROP TABLE env_sink")
        assert owner == ("env_writer",)


def test_a_stopped_database_is_an_outage_waited_out_not_a_failed_batch(spark: Any) -> None:
    """Chaos scenario 3: PostgreSQL down under the JDBC sink. Connection refused must not
    spend the batch's attempts (maxRetries 0 here: one bad try would fail it); the sink
    retries until the server is back and writes every record once."""
    from offtake_testbed.postgres import PostgresServer

    with PostgresServer() as server:
        jdbc = {"url": server.jdbc_url, "table": "outage_sink", "user": server.user}
        spec = pipeline(
            {"format": "jdbc", "jdbc": jdbc, "batch": {"maxRecords": 50}},
            errors={"policy": "skip", "maxRetries": 0, "retryBackoffSeconds": 0.2},
        )
        server.shut_down()
        with pytest.raises(psycopg.OperationalError) as refused:
            psycopg.connect(server.dsn, connect_timeout=5)
        assert unavailable(refused.value) is not None  # psycopg's view (Connect mode's swap)
        assert unavailable(ValueError("bad column")) is None
        metrics = Metrics("test")

        def start_again_once_refused() -> None:
            # Back once the sink was refused at least once: a fixed 4 s raced the Spark job's
            # start, and on a loaded machine the first try came after the restart.
            wait_for(
                lambda: metric(metrics, "offtake_spark_jobs_total", result="retry") >= 1,
                timeout=120,
                what="the sink to be refused by the stopped database",
            )
            server.start_again()

        restart = threading.Thread(target=start_again_once_refused, daemon=True)
        restart.start()
        try:
            done, _ = run_sink(spec, spark, [items(range(100))], timeout=120, metrics=metrics)
        finally:
            restart.join()
        assert len(done.ok) == 100 and not done.failed
        assert _offsets(server, "outage_sink") == [(0, o) for o in range(100)]
        # Tried while the server was down (each a "retry"), then succeeded.
        assert metric(metrics, "offtake_spark_jobs_total", result="retry") >= 1
        assert metric(metrics, "offtake_spark_jobs_total", result="failure") == 0
