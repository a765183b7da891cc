"""Fixtures for the Spark sink tests: one local SparkSession for the whole test session
(a JVM start costs seconds and this machine has two cores), PostgreSQL, and a Spark Connect
server started from the pyspark wheel."""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from offtake.sinks.spark.session import POSTGRES_JDBC, create_session, session_config

from .connect_server import ConnectServer
from .support import pipeline

TIMINGS: dict[str, float] = {}


def _tests_package() -> None:
    """Make ``tests.spark.transforms`` importable in this process, as the worker imports a
    transform named ``module:callable``.

    pytest imports this folder as the package ``spark`` (its rootdir-relative name), and the
    repository root is not on sys.path (it must not be: its operator/ folder would shadow the
    standard library's ``operator``). So ``tests`` becomes a package over the tests folder
    alone. Worker processes started by the tests run with the repository as their working
    directory and import it from there.
    """
    if "tests" in sys.modules:
        return
    spec = importlib.util.spec_from_loader("tests", loader=None, is_package=True)
    assert spec is not None and spec.submodule_search_locations is not None
    spec.submodule_search_locations.append(str(Path(__file__).resolve().parents[1]))
    sys.modules["tests"] = importlib.util.module_from_spec(spec)


_tests_package()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The shared in-process session, with the PostgreSQL JDBC driver from Maven Central."""
    spec = pipeline(
        {
            "format": "parquet",
            "path": "/unused",
            "packages": [POSTGRES_JDBC],
            "submit": {
                "master": "local[2]",
                "conf": {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "2g"},
            },
        }
    )
    assert spec.sink.spark is not None
    began = time.monotonic()
    session = create_session(session_config(spec.sink.spark, "tests"))
    TIMINGS["jvm_start_seconds"] = time.monotonic() - began
    print(f"\nlocal SparkSession ready in {TIMINGS['jvm_start_seconds']:.1f}s")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    from offtake_testbed.postgres import PostgresServer, PostgresTestbedError

    server = PostgresServer()
    try:
        server.start()
    except PostgresTestbedError as exc:
        pytest.fail(f"the PostgreSQL testbed could not start: {exc}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def connect_server() -> Iterator[ConnectServer]:
    """The Spark Connect server from the pyspark wheel, one for the session (a JVM start costs
    seconds on two cores). A module may still define its own ``connect_server``."""
    server = ConnectServer(conf={"spark.sql.shuffle.partitions": "2"})
    try:
        server.start()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    TIMINGS["connect_server_start_seconds"] = server.started_seconds
    print(f"\nSpark Connect server on {server.url} in {server.started_seconds:.1f}s")
    yield server
    server.stop()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        terminalreporter.section("spark sink timings")
        for k, v in TIMINGS.items():
            terminalreporter.write_line(f"{k}: {v:.3f}")
