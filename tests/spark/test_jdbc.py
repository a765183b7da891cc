"""JDBC sink into a real PostgreSQL: staging table, then delete + insert in one transaction."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from .support import items, pipeline, run_sink

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


def test_jdbc_nested_json_is_stored_as_text(spark: Any, postgres: Any) -> None:
    jdbc = {"url": postgres.jdbc_url, "table": "nested_sink", "user": postgres.user}
    spec = pipeline({"format": "jdbc", "jdbc": jdbc})
    recs = items(range(3))
    for r in recs:
        r.values = [{"id": r.record.offset, "addr": {"city": "x"}, "tags": ["a", "b"]}]
    done, _ = run_sink(spec, spark, [recs])
    assert len(done.ok) == 3
    with psycopg.connect(postgres.dsn) as conn:
        row = conn.execute("SELECT addr, tags FROM nested_sink WHERE id = 1").fetchone()
    assert row == ('{"city":"x"}', '["a","b"]')
