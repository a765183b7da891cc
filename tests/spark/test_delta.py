"""Delta sink (delta-spark from Maven Central): replaceWhere on the lineage columns makes a
rewritten batch replace its earlier copy in one Delta commit."""

from __future__ import annotations

from pathlib import Path

import pytest

from .connect_server import ConnectServer
from .test_connect import _run, connect_job

pytestmark = pytest.mark.spark


def _offsets(url: str, path: Path) -> list[tuple[int, int]]:
    return [tuple(p) for p in connect_job("--read", url, "delta", str(path), timeout=300)]


def test_delta_batches_rewritten_after_a_crash_leave_each_record_once(
    delta_server: ConnectServer, tmp_path: Path
) -> None:
    path = tmp_path / "delta_table"
    sink = {
        "format": "delta",
        "path": str(path),
        "batch": {"maxRecords": 250},
        "submit": {"mode": "connect", "connectUrl": delta_server.url},
    }
    assert _run(sink, 0, 1000)["ok"] == 1000
    expected = [(0, o) for o in range(1000)]
    assert _offsets(delta_server.url, path) == expected
    assert _run(sink, 0, 1000)["ok"] == 1000  # the same batches again
    assert _run({**sink, "batch": {"maxRecords": 400}}, 250, 1000)["ok"] == 750  # cut elsewhere
    assert _offsets(delta_server.url, path) == expected
    assert len(list((path / "_delta_log").glob("*.json"))) == 4 + 4 + 2  # one commit per batch
