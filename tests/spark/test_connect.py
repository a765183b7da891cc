"""Connect mode end to end: the sink in a process without a JVM, writing through the Spark
Connect server from the pyspark wheel; batches written again leave one copy."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .connect_server import ConnectServer

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def connect_server() -> Iterator[ConnectServer]:
    server = ConnectServer()
    try:
        server.start()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    print(f"\nSpark Connect server on {server.url} in {server.started_seconds:.1f}s")
    yield server
    server.stop()


def connect_job(*args: str, timeout: float) -> Any:
    """Run ``tests/spark/connect_job.py`` (a process of its own: no JVM in this one) and return
    the JSON of its last line."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.connect_job", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _run(spark: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    arg = json.dumps({"spark": spark, "start": start, "stop": stop})
    out: dict[str, Any] = connect_job(arg, timeout=400)
    return out


def test_connect_mode_writes_batches_exactly_once(
    connect_server: ConnectServer, spark: Any, tmp_path: Path
) -> None:
    path = tmp_path / "connect_table"
    sink = {
        "format": "parquet",
        "path": str(path),
        "batch": {"maxRecords": 250},
        "submit": {"mode": "connect", "connectUrl": connect_server.url},
    }
    first = _run(sink, 0, 1000)
    assert first == {"ok": 1000, "failed": 0, "errors": [], "remote": True, "jvm": False}
    second = _run({**sink, "batch": {"maxRecords": 400}}, 250, 1000)  # replay from a commit
    assert second["ok"] == 750
    offsets = sorted(r["offset"] for r in spark.read.parquet(str(path)).select("offset").collect())
    assert offsets == list(range(1000))
