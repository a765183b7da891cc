"""Short variants of chaos scenario 3's Spark halves (the long ones: ``python bench/chaos.py
--only 3``): PostgreSQL stopped under the JDBC sink, and the Spark Connect server SIGKILLed
and started again under a worker in connect mode. Nothing lost, nothing dead-lettered for the
outage, the worker resumes by itself, its memory stays near ``limits.maxInFlightBytes``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spark.connect_server import ConnectServer
from support.chaos.s03_sink_outages import ConnectKilled, PostgresDown, spark_sink_outage
from support.reports import report
from support.servers import started

from offtake_testbed.kafka import KafkaBroker
from offtake_testbed.postgres import PostgresServer, PostgresTestbedError

pytestmark = [pytest.mark.chaos, pytest.mark.spark]


@pytest.fixture
def stoppable_postgres() -> Iterator[PostgresServer]:
    """A server of this test's own: it is stopped mid-test, which other tests must not see."""
    with started(PostgresServer(), PostgresTestbedError) as server:
        yield server


@pytest.fixture
def killable_connect_server() -> Iterator[ConnectServer]:
    with started(ConnectServer(conf={"spark.sql.shuffle.partitions": "2"}), RuntimeError) as s:
        yield s


def test_postgres_stopped_under_the_jdbc_sink_loses_and_dead_letters_nothing(
    kafka_broker: KafkaBroker, stoppable_postgres: PostgresServer, tmp_path: Path
) -> None:
    outcome = spark_sink_outage(
        kafka_broker, tmp_path, PostgresDown(stoppable_postgres), records=5_000, outage=15.0
    )
    report("chaos-jdbc-outage", **vars(outcome))
    outcome.check()
    assert outcome.duplicated == 0


def test_spark_connect_server_killed_under_the_sink_loses_and_dead_letters_nothing(
    kafka_broker: KafkaBroker, killable_connect_server: ConnectServer, tmp_path: Path
) -> None:
    target: Any = ConnectKilled(killable_connect_server, tmp_path / "table")
    outcome = spark_sink_outage(
        kafka_broker, tmp_path, target, records=5_000, outage=10.0, restart_on_exit=True
    )
    report("chaos-connect-outage", **vars(outcome))
    outcome.check()
    assert outcome.duplicated == 0
