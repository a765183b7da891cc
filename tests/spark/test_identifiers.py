"""Column names from records (sinks/spark/identifiers.py): hostile names are refused before
they reach SQL or Spark, each naming the field; the names let through are quoted as psycopg
quotes them. Hypothesis feeds quotes, statement breaks, backticks, NUL, newlines, unicode and
1000-character names through the checks; the last test round-trips let-through names as real
PostgreSQL columns."""

from __future__ import annotations

import re
import time
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg import sql

from offtake.metrics import Metrics
from offtake.sinks.base import Sink, SinkBatch
from offtake.sinks.spark import SparkSink
from offtake.sinks.spark.columns import column_name
from offtake.sinks.spark.identifiers import (
    ANSI,
    DELTA,
    MYSQL,
    POSTGRES,
    SPARK,
    NameCheck,
    UnsafeName,
    dialect_of,
    problem,
    quote,
    shown,
    table_problem,
)
from offtake.sinks.spark.writers import STAGING_SUFFIX_CHARS

from .support import Collector, item, pipeline

DIALECTS = (POSTGRES, MYSQL, ANSI, SPARK, DELTA)

# What an attacker puts in a field name: SQL and Spark syntax, and what breaks lines or strings.
HOSTILE = [
    'a") SELECT 1; DROP TABLE victims; --',
    'x" int); DROP TABLE victims; --',
    "a`; DROP TABLE victims; --",
    "a'); DROP TABLE victims; --",
    "col\x00umn",
    "line\nbreak",
    "tab\there",
    "a.b",
    "a b",
    "a;b",
    "a=b",
    "a?b",
    "a%sb",
    "(a)",
    "{a}",
    "a,b",
    "a\u202eb",  # right-to-left override: a name that reads otherwise than it is
    "a\u200bb",  # zero-width space
    "\ud800",  # a lone surrogate (a JSON "\\ud800" escape decodes to it)
    "",
    "x" * 1000,
]

_hostile_char = st.sampled_from(
    list("\"'`;.,= \t\n\r\x00\\/()[]{}?%*+:<>|&!#@$~^\u202e\u200b\ufeff")
)


@st.composite
def hostile_names(draw: st.DrawFn) -> str:
    """Any text with at least one character outside the allowlist."""
    head = draw(st.text(max_size=30))
    tail = draw(st.text(max_size=30))
    return head + draw(_hostile_char) + tail


@pytest.mark.parametrize("name", HOSTILE, ids=range(len(HOSTILE)))
def test_each_known_attack_name_is_refused_by_every_dialect(name: str) -> None:
    for dialect in DIALECTS:
        assert problem(name, dialect) is not None, (name, dialect.name)
        with pytest.raises(UnsafeName):
            quote(name, dialect)
        with pytest.raises(UnsafeName) as refused:
            NameCheck(dialect, column_name).check({"id": 1, name: 2}, "orders[0]@7")
        message = str(refused.value)
        assert "orders[0]@7" in message and shown(name) in message
        assert "\n" not in message and "\x00" not in message  # one line, header-safe


@settings(max_examples=400, deadline=None)
@given(name=hostile_names(), dialect=st.sampled_from(DIALECTS))
def test_a_name_with_any_character_outside_the_allowlist_fails_its_record(
    name: str, dialect: Any
) -> None:
    check = NameCheck(dialect, column_name)
    with pytest.raises(UnsafeName) as refused:
        check.check({"ok": 1, name: 2}, "orders[3]@42")
    assert shown(name) in str(refused.value)
    check.check({"ok": 1}, "orders[3]@43")  # the next record, without it, passes


@settings(max_examples=400, deadline=None)
@given(name=st.text(max_size=80))
def test_what_passes_is_quoted_exactly_as_psycopg_quotes_it(name: str) -> None:
    why = problem(name, POSTGRES)
    if why is not None:
        with pytest.raises(UnsafeName):
            quote(name, POSTGRES)
        return
    quoted = quote(name, POSTGRES)
    assert quoted == sql.Identifier(name).as_string(None)
    # Nothing that ends a quoted name or a statement, or that a driver rewrites ('?', '%').
    assert not set(name) & set("\"'`;\x00\n?%.")
    assert len(name.encode()) <= 63


def test_length_limits_count_bytes_for_postgres() -> None:
    assert problem("a" * 63, POSTGRES) is None
    assert problem("a" * 64, POSTGRES) is not None  # PostgreSQL would truncate it
    assert problem("é" * 31, POSTGRES) is None  # 62 bytes
    assert problem("é" * 32, POSTGRES) is not None  # 64 bytes, 32 characters
    assert problem("a" * 255, SPARK) is None and problem("a" * 256, SPARK) is not None
    assert problem("Größe_2", POSTGRES) is None and problem("क़ीमत", POSTGRES) is None


def test_names_that_would_be_one_column_fail_their_record() -> None:
    check = NameCheck(SPARK, column_name)
    with pytest.raises(UnsafeName, match="'Amount' and 'amount'"):
        check.check({"Amount": 1, "amount": 2}, "orders[0]@1")
    # "topic" is renamed value_topic (the Kafka metadata column keeps its name).
    with pytest.raises(UnsafeName, match="value_topic"):
        check.check({"topic": "a", "value_topic": "b"}, "orders[0]@2")
    check.check({"topic": "a", "amount": 1}, "orders[0]@3")


def test_nested_names_are_checked_where_the_target_refuses_them() -> None:
    nested = {"id": 1, "addr": {"ci`ty": "x"}, "lines": [{"sk;u": 1}]}
    with pytest.raises(UnsafeName, match=r"addr\.ci`ty"):
        NameCheck(DELTA, column_name).check(nested, "orders[0]@1")
    with pytest.raises(UnsafeName, match=r"lines\[\]\[\]\.sk;u"):
        NameCheck(DELTA, column_name).check({"lines": [[{"sk;u": 1}]]}, "orders[0]@1")
    # JDBC writes nested values as JSON text: their keys are data, not names; parquet, json
    # and iceberg store any struct field name, and nothing refers to one by name.
    NameCheck(POSTGRES, column_name).check(nested, "orders[0]@1")
    NameCheck(SPARK, column_name).check(nested, "orders[0]@1")


def test_dialects_by_url() -> None:
    assert dialect_of("jdbc", "jdbc:postgresql://db/x") is POSTGRES
    assert dialect_of("jdbc", "jdbc:mariadb://db/x") is MYSQL
    assert dialect_of("jdbc", "jdbc:sqlserver://db;databaseName=x") is ANSI
    assert dialect_of("parquet", None) is SPARK and dialect_of("delta", None) is DELTA
    assert quote("a", MYSQL) == "`a`" and quote("a", ANSI) == '"a"'


@pytest.mark.parametrize(
    "table",
    ["orders; DROP TABLE victims", 'public."orders"', "orders--", "1orders", "a.b.c.d", "x" * 37],
)
def test_a_jdbc_table_spark_cannot_paste_safely_is_refused_at_start(table: str) -> None:
    assert table_problem(table, POSTGRES, STAGING_SUFFIX_CHARS) is not None
    spec = pipeline({"format": "jdbc", "jdbc": {"url": "jdbc:postgresql://db/x", "table": table}})
    with pytest.raises(ValueError, match=r"^sink\.spark\.jdbc\.table: "):
        SparkSink(spec, Metrics("test"))


def test_plain_jdbc_tables_are_taken() -> None:
    for table in ("orders", "public.orders", "Shop.Orders_2", "x" * 36):
        assert table_problem(table, POSTGRES, STAGING_SUFFIX_CHARS) is None, table


def test_the_sink_fails_a_hostile_record_and_batches_its_neighbours() -> None:
    """The record fails at once, alone, in a settlement of its own (the engine then applies
    errors.policy to it); the records around it join the batch."""
    spec = pipeline({"format": "jdbc", "jdbc": {"url": "jdbc:postgresql://db/x", "table": "t"}})
    sink = SparkSink(spec, Metrics("test"))
    done = Collector()
    Sink.start(sink, done)  # the callback alone: no job thread, no Spark here
    hostile = item(1, {"id": 1, 'a") SELECT 1; DROP TABLE victims; --': 1})
    sink.submit(SinkBatch.of([item(0), hostile, item(2)]))
    [(failed, error)] = done.failed
    assert failed is hostile and isinstance(error, UnsafeName)
    assert re.search(r"orders\[0\]@1: field 'a\"\) SELECT 1", str(error)), error
    closed = sink._batcher.close(None)
    assert [it.record.offset for b in closed for it in b.items] == [0, 2]


_allowed = st.text(
    alphabet=st.characters(categories=("L", "Nd", "Mn"), include_characters="_-"),
    min_size=1,
    max_size=20,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(names=st.lists(_allowed, min_size=1, max_size=4))
def test_let_through_names_are_exactly_the_real_postgresql_columns(
    postgres: Any, names: list[str]
) -> None:
    names = [n for n in names if problem(n, POSTGRES) is None]
    if not names or len(set(names)) != len(names):
        return
    cols = ", ".join(f"{quote(n, POSTGRES)} int" for n in names)
    with psycopg.connect(postgres.dsn) as conn:
        conn.execute(f"CREATE TEMP TABLE t_names ({cols})")
        got = [
            r[0]
            for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = 't_names'::regclass "
                "AND attnum > 0 ORDER BY attnum"
            ).fetchall()
        ]
        conn.rollback()
    assert got == names


def test_a_nul_in_a_text_value_fails_its_record_for_postgres_only() -> None:
    value = {"id": 1, "note": "a\x00b"}
    with pytest.raises(UnsafeName, match="field 'note': the value holds a NUL"):
        NameCheck(POSTGRES, column_name).check(value, "orders[0]@1")
    NameCheck(SPARK, column_name).check(value, "orders[0]@1")
    NameCheck(MYSQL, column_name).check(value, "orders[0]@1")


def test_a_parquet_sink_refuses_what_spark_would_interpret_and_writes_the_rest(
    spark: Any, tmp_path: Any
) -> None:
    """Spark's own formats: names with a backtick, a dot or a newline, and names Spark would
    take for one column. Each such record fails at once naming its field (the engine
    applies errors.policy to it); its neighbours land in the same job."""
    import pyarrow.dataset as pads

    spec = pipeline({"format": "parquet", "path": str(tmp_path / "t")})
    sink = SparkSink(spec, Metrics("test"), session=spark)
    done = Collector()
    sink.start(done)
    hostile = {
        1: ({"id": 1, "a`b": 1}, "'a`b'"),
        3: ({"id": 3, "a.b": 1}, "'a.b'"),
        5: ({"id": 5, "qty\n": 1}, "'qty\\n'"),
        9: ({"id": 9, "Note": "x", "note": "y"}, "'Note' and 'note'"),
    }
    batch = [item(o, hostile[o][0]) if o in hostile else item(o) for o in range(12)]
    sink.submit(SinkBatch.of(batch))
    refused = list(done.failed)
    done.failed.clear()
    assert sorted(it.record.offset for it, _ in refused) == sorted(hostile)
    for it, error in refused:
        assert isinstance(error, UnsafeName)
        assert hostile[it.record.offset][1] in str(error), error
    deadline = time.monotonic() + 240
    while done.count < len(batch) - len(hostile) and time.monotonic() < deadline:
        sink.drain(None, 1.0)
    sink.close()
    assert not done.failed
    rows = pads.dataset(str(tmp_path / "t"), format="parquet").to_table().to_pylist()
    assert sorted(r["offset"] for r in rows) == [o for o in range(12) if o not in hostile]


_SINKS = {
    "jdbc": pipeline({"format": "jdbc", "jdbc": {"url": "jdbc:postgresql://db/x", "table": "t"}}),
    "delta": pipeline({"format": "delta", "path": "/tmp/unused-delta"}),
}


@settings(max_examples=300, deadline=None)
@given(name=st.one_of(st.text(max_size=70), hostile_names()), fmt=st.sampled_from(sorted(_SINKS)))
@example(name="id", fmt="delta")  # found by a bare-machine run: the record's own "id" field
@example(name="ID", fmt="delta")  # another spelling of it: refused as the same column
def test_any_name_through_the_sinks_submit_is_batched_only_if_it_is_safe(
    name: str, fmt: str
) -> None:
    """Through SparkSink.submit (the engine's call): a record is batched only if every name
    passes the allowlist; otherwise it fails at once with an error naming the field."""
    sink = SparkSink(_SINKS[fmt], Metrics("test"))
    value = {"id": 1, name: "v"}
    done = Collector()
    Sink.start(sink, done)  # the callback alone: no job thread, no Spark here
    sink.submit(SinkBatch.of([item(0, value)]))
    if done.failed:
        [(_, exc)] = done.failed
        assert isinstance(exc, UnsafeName)
        assert shown(name) in str(exc) or "would be the same column" in str(exc)
        assert not sink._batcher.close(None)
        return
    column = column_name(name)
    assert problem(column, sink.names.dialect) is None
    assert not set(column) & set("\"'`;.\x00\n ?%")
    if name != "id":  # {"id": 1, "id": "v"} is one field, "id": no second column to collide
        assert column.casefold() != "id"
