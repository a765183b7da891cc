"""Fixtures for the Spark sink tests: PostgreSQL and a Spark Connect server started from the
pyspark wheel. The local SparkSession (``spark``) is tests/conftest.py's, shared with the sink
contract suite."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.servers import started

from .connect_server import ConnectServer

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
def postgres() -> Iterator[Any]:
    from offtake_testbed.postgres import PostgresServer, PostgresTestbedError

    with started(PostgresServer(), PostgresTestbedError) as server:
        yield server


@pytest.fixture(scope="session")
def connect_server() -> Iterator[ConnectServer]:
    """The Spark Connect server from the pyspark wheel, one for the session (a JVM start costs
    seconds on two cores). A module may still define its own ``connect_server``."""
    with started(ConnectServer(conf={"spark.sql.shuffle.partitions": "2"}), RuntimeError) as s:
        TIMINGS["connect_server_start_seconds"] = s.started_seconds
        print(f"\nSpark Connect server on {s.url} in {s.started_seconds:.1f}s")
        yield s


@pytest.fixture(scope="session")
def delta_server() -> Iterator[ConnectServer]:
    """The Delta-capable Spark Connect server (delta_server.py), one for the session: the
    Delta tests of test_delta.py and test_crash_on_kafka.py share its JVM start."""
    import subprocess

    from .delta_server import delta_connect_server

    try:
        server = delta_connect_server().start()
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"the Delta-capable Spark Connect server did not start: {exc}", pytrace=False)
    TIMINGS["delta_connect_server_start_seconds"] = server.started_seconds
    yield server
    server.stop()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        terminalreporter.section("spark sink timings")
        for k, v in TIMINGS.items():
            terminalreporter.write_line(f"{k}: {v:.3f}")
