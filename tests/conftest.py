"""Fixtures shared by every test folder: the real Kafka broker (the testbed's plugins) and one
local SparkSession for the whole test session (a JVM start costs seconds and this machine has
two cores; the Spark sink tests and the sink contract suite both write through it)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest_plugins = ["offtake_testbed.pytest_plugin", "offtake_testbed.pytest_plugin_kube"]


@pytest.fixture(scope="session", autouse=True)
def spark_scratch_is_removed() -> Iterator[str]:
    """Spark's spark-* and blockmgr-* scratch folders go to one folder removed at the end.

    Spark writes them under SPARK_LOCAL_DIRS (default /tmp) and leaves some behind; every JVM
    of the run inherits the variable: the shared session, worker processes, Connect servers.
    """
    scratch = tempfile.mkdtemp(prefix="offtake-tests-spark-")
    previous = os.environ.get("SPARK_LOCAL_DIRS")
    os.environ["SPARK_LOCAL_DIRS"] = scratch
    yield scratch
    if previous is None:
        os.environ.pop("SPARK_LOCAL_DIRS", None)
    else:
        os.environ["SPARK_LOCAL_DIRS"] = previous
    shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The shared in-process session, with the PostgreSQL JDBC driver from Maven Central."""
    from offtake.config.loader import parse_pipeline
    from offtake.sinks.spark.session import POSTGRES_JDBC, create_session, session_config

    spec = parse_pipeline(
        {
            "apiVersion": "offtake.dev/v1alpha1",
            "kind": "ConsumerPipeline",
            "metadata": {"name": "tests", "namespace": "test"},
            "spec": {
                "kafka": {"bootstrapServers": "unused:9092"},
                "source": {"topics": ["orders"]},
                "sink": {
                    "spark": {
                        "format": "parquet",
                        "path": "/unused",
                        "packages": [POSTGRES_JDBC],
                        "submit": {
                            "master": "local[2]",
                            "conf": {
                                "spark.sql.shuffle.partitions": "2",
                                "spark.driver.memory": "2g",
                            },
                        },
                    }
                },
            },
        }
    )
    assert spec.sink.spark is not None
    began = time.monotonic()
    session = create_session(session_config(spec.sink.spark, "tests"))
    print(f"\nlocal SparkSession ready in {time.monotonic() - began:.1f}s")
    yield session
    session.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The Spark tier's files run first, the rest in their usual order.

    scripts/test.sh runs the suite in one process per CPU, a file at a time (pytest-xdist's
    loadfile), handing out files in this order. The Spark files are the longest units (a Delta
    crash test alone takes minutes); handed out last, as their folder's name placed them, one
    process ran them alone while the other had finished. First, the short files fill in around
    them. A file goes first if any of its tests needs Spark (so a file is never split), and the
    sort is stable: the tests of one file keep their order.
    """
    spark_files = {
        item.path
        for item in items
        if item.get_closest_marker("spark") is not None or item.path.parent.name == "spark"
    }
    items.sort(key=lambda item: item.path not in spark_files)
