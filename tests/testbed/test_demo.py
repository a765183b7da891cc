"""The README's first command runs the example pipeline end to end (scripts/demo.sh runs
``python -m offtake_testbed.demo``): nothing else in the suite ran it, and a change to
examples/kafka-to-kafka.yaml once broke it unnoticed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_runs_the_example_pipeline_to_lag_zero() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "offtake_testbed.demo", "--records", "2000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    figures = {
        m.group(1).strip(): int(m.group(2))
        for m in re.finditer(r"^  ([a-z ,]+?)\s+(\d+)(?: records)?", out, re.M)
    }
    assert figures["records consumed"] == 2000
    # Every sample order is accounted for: delivered, dropped by the function or dead-lettered.
    assert (
        figures["processed, delivered"] + figures["processed, dropped"] + figures["processed, dlq"]
        == 2000
    )
    assert figures["lag after the run"] == 0
    assert figures["output"] == figures["processed, delivered"]
    assert figures["dead letters"] == figures["processed, dlq"]
    assert "worker exit code      0" in out
