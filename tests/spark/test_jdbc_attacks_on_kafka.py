"""Record data stays data: hostile field names against the JDBC sink, on the real broker, the
real PostgreSQL and Spark (the engine as the CLI builds it, in this process, on the shared
SparkSession).

A producer who may write one JSON record to the source topic chooses its field names, which
become column names; Spark's JDBC writer pastes them between quotes, unescaped, into its
staging CREATE TABLE. Here such records try to drop a table of the sink's database: the
table stays with its rows, each hostile record is dead-lettered with headers naming its field,
and every good record lands once. A statement the database refuses (a type mismatch) puts
PostgreSQL's own message in the dead letters and the log, not py4j's "An error occurred while
calling ...", and no password."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from support.workers import manifest, produce, read_all, wait_caught_up

from offtake.config.secret_env import JDBC_PASSWORD_ENV
from offtake.config.spec import JdbcSpec
from offtake.logs import JsonFormatter
from offtake.sinks.spark.errors import describe
from offtake.sinks.spark.identifiers import shown
from offtake.sinks.spark.jdbc import JdbcError, JvmStatements, PsycopgStatements
from offtake_testbed.kafka import KafkaBroker

from .support import EngineThread

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

VICTIM_ROWS = 3
EXPLOIT = 'z") SELECT NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL WHERE false;DROP TABLE victims;--'
# Field names that try to end the quoted name and run a statement of their own, in Spark's
# CREATE TABLE (double quotes), the swap's INSERT, a Spark expression (backtick), or that
# would cut or fold the name (NUL, a newline, 1000 characters, two spellings of one column).
HOSTILE = [
    # Dropped the table before the check: it closes the swap's column list at "z" (a field
    # of the same record), inserts nothing and runs the DROP.
    EXPLOIT,
    'a") SELECT 1; DROP TABLE victims; --',
    'x" TEXT); DROP TABLE victims; CREATE TABLE y ("z',
    "b`) ; DROP TABLE victims; --",
    "c'; DROP TABLE victims; --",
    "nul\x00byte",
    "new\nline",
    "w" * 1000,
]
PASSWORD = "Sekr3t-" + uuid.uuid4().hex[:8]


def _sql(postgres: Any, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        cur = conn.execute(statement)
        return cur.fetchall() if cur.description else []


@pytest.fixture
def victims(postgres: Any) -> Iterator[str]:
    """A table of the sink's database that the hostile records name; dropped afterwards with
    the sink's table, as the other JDBC tests count the schema's tables."""
    target = f"attacked_{uuid.uuid4().hex[:8]}"
    _sql(postgres, "DROP TABLE IF EXISTS victims")
    _sql(postgres, "CREATE TABLE victims (id int)")
    _sql(postgres, f"INSERT INTO victims SELECT generate_series(1, {VICTIM_ROWS})")
    yield target
    _sql(postgres, "DROP TABLE IF EXISTS victims")
    _sql(postgres, f"DROP TABLE IF EXISTS {target}")
    for (name,) in _sql(
        postgres,
        "SELECT table_name FROM information_schema.tables "
        f"WHERE table_schema = 'public' AND table_name LIKE '{target}%'",
    ):
        _sql(postgres, f'DROP TABLE IF EXISTS "{name}"')


@pytest.fixture(autouse=True)
def _jdbc_password(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the operator renders from jdbc.passwordSecretRef: the worker reads it from here."""
    monkeypatch.setenv(JDBC_PASSWORD_ENV, PASSWORD)


def _doc(
    bootstrap: str, src: str, dlq: str, postgres: Any, table: str, *, retries: int = 0
) -> dict[str, Any]:
    # The password comes from its Secret's variable (an inline one is refused at validation;
    # trust auth ignores it): nothing may show it.
    url = f"{postgres.jdbc_url}?user={postgres.user}"
    return manifest(
        f"jdbc-attack-{uuid.uuid4().hex[:6]}",
        bootstrap,
        [src],
        sink={
            "spark": {
                "format": "jdbc",
                "jdbc": {
                    "url": url,
                    "table": table,
                    "passwordSecretRef": {"name": "pg", "key": "password"},
                },
                "batch": {"maxRecords": 1000, "maxIntervalSeconds": 1},
            }
        },
        errors={"policy": "dlq", "maxRetries": retries, "dlq": {"topic": dlq}},
    )


def _headers(message: Any) -> dict[str, str]:
    return {k: (v or b"").decode() for k, v in message.headers() or []}


def test_hostile_field_names_are_dead_lettered_naming_the_field_and_run_nothing(
    kafka_broker: KafkaBroker,
    topic_factory: Any,
    postgres: Any,
    spark: Any,
    victims: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="offtake")
    src, dlq = topic_factory(), topic_factory()
    values: list[dict[str, Any]] = []
    hostile_at: dict[int, str] = {}
    good = iter(range(1000))
    for name in HOSTILE:
        values += [{"id": next(good), "amount": 1.5}, {"id": next(good), "amount": 2.5}]
        hostile_at[len(values)] = name
        values.append({"id": 900 + len(hostile_at), "amount": 0.5, name: 1, "z": 1})
    values.append({"id": 999, "Amount": 1.0, "amount": 2.0})  # one column, two spellings
    hostile_at[len(values) - 1] = "Amount"
    values.append({"id": 998, "amount": 1.0, "note": "nul\x00in a value"})  # not for PG text
    hostile_at[len(values) - 1] = "note"
    good_ids = sorted(v["id"] for i, v in enumerate(values) if i not in hostile_at)
    produce(kafka_broker.bootstrap, src, values)

    doc = _doc(kafka_broker.bootstrap, src, dlq, postgres, victims)
    running = EngineThread(doc, spark)
    try:
        wait_caught_up(kafka_broker.bootstrap, doc["spec"]["source"]["groupId"], src, 1)
    finally:
        assert running.stop() == 0

    # Nothing ran: the victim table is there with its rows, and no hostile column was made.
    assert _sql(postgres, "SELECT count(*) FROM victims") == [(VICTIM_ROWS,)]
    columns = {
        r[0]
        for r in _sql(
            postgres,
            f"SELECT column_name FROM information_schema.columns WHERE table_name = '{victims}'",
        )
    }
    assert columns == {
        "topic",
        "partition",
        "offset",
        "timestamp",
        "key",
        "id",
        "amount",
        "_offtake_topic",
        "_offtake_partition",
        "_offtake_start",
        "_offtake_end",
    }
    # Every good record once, including the neighbours of each hostile one in its batch.
    landed = _sql(postgres, f"SELECT id, count(*) FROM {victims} GROUP BY id ORDER BY id")
    assert [r[0] for r in landed] == good_ids and {r[1] for r in landed} == {1}

    # Each hostile record dead-lettered as produced, its headers naming the field.
    dead = read_all(kafka_broker.bootstrap, dlq)
    assert sorted(int(_headers(m)["offtake.original.offset"]) for m in dead) == sorted(hostile_at)
    for m in dead:
        h = _headers(m)
        offset = int(h["offtake.original.offset"])
        assert json.loads(m.value()) == values[offset]
        assert (
            h["offtake.error.class"].endswith(".UnsafeName") and h["offtake.error.stage"] == "sink"
        )
        assert shown(hostile_at[offset]) in h["offtake.error.message"], h
        assert f"record {src}[0]@{offset}: field" in h["offtake.error.message"]
    # ... and the log says so, one line per record, naming the field.
    logged = [r.getMessage() for r in caplog.records if "failed after" in r.getMessage()]
    for name in HOSTILE:
        assert any(shown(name) in line for line in logged), (name, logged)


def test_a_statement_the_database_refuses_dead_letters_its_own_message_without_password(
    kafka_broker: KafkaBroker,
    topic_factory: Any,
    postgres: Any,
    spark: Any,
    victims: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The sink's table has amount as a number; records bring text. Spark stages them fine,
    the swap's INSERT fails in PostgreSQL: its message must reach the DLQ and the log."""
    caplog.set_level(logging.WARNING, logger="offtake")
    _sql(
        postgres,
        f'CREATE TABLE {victims} (topic text, partition int, "offset" bigint, '
        '"timestamp" timestamptz, key bytea, id bigint, amount double precision, '
        "_offtake_topic text, _offtake_partition int, _offtake_start bigint, "
        "_offtake_end bigint)",
    )
    src, dlq = topic_factory(), topic_factory()
    values = [{"id": i, "amount": f"lots-{i}"} for i in range(5)]
    produce(kafka_broker.bootstrap, src, values)
    doc = _doc(kafka_broker.bootstrap, src, dlq, postgres, victims)
    running = EngineThread(doc, spark)
    try:
        wait_caught_up(kafka_broker.bootstrap, doc["spec"]["source"]["groupId"], src, 1)
    finally:
        assert running.stop() == 0

    dead = read_all(kafka_broker.bootstrap, dlq)
    assert len(dead) == len(values)
    expected = 'column "amount" is of type double precision but expression is of type'
    for m in dead:
        message = _headers(m)["offtake.error.message"]
        assert expected in message, message
        assert "swap into" in message and "An error occurred while calling" not in message
        assert PASSWORD not in json.dumps(_headers(m))
    lines = [r.getMessage() for r in caplog.records]
    assert any(expected in line for line in lines), lines
    # As the worker writes its log: JSON lines, through redact().
    formatted = [JsonFormatter("t").format(r) for r in caplog.records]
    assert not any(PASSWORD in line for line in formatted)
    assert _sql(postgres, f"SELECT count(*) FROM {victims}") == [(0,)]


def test_a_driver_error_that_quotes_the_url_is_redacted(spark: Any) -> None:
    """The JVM's own "No suitable driver found for <url>" quotes the whole URL."""
    url = f"jdbc:nosuchdb://db:1/orders?user=app&password={PASSWORD}"
    statements = JvmStatements(spark, JdbcSpec(url=url, table="t"))
    with pytest.raises(JdbcError) as refused:
        statements.execute("SELECT 1")
    message = str(refused.value)
    assert "No suitable driver" in message and "password=***" in message, message
    assert PASSWORD not in message


def test_without_a_jvm_the_swap_error_is_postgresqls_own_message_too(
    postgres: Any, victims: str
) -> None:
    """Spark Connect mode: the swap runs through psycopg; its error reads the same way."""
    url = f"{postgres.jdbc_url}?user={postgres.user}&password={PASSWORD}"
    statements = PsycopgStatements(JdbcSpec(url=url, table=victims))
    statements.execute(f"CREATE TABLE {victims} (amount double precision)")
    with pytest.raises(psycopg.Error) as refused:
        statements.transaction([(f"INSERT INTO {victims} (amount) SELECT 'lots'::text", [])])
    why = describe(refused.value)
    assert 'column "amount" is of type double precision' in why, why
    assert PASSWORD not in why
