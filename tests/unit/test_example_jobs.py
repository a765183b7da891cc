"""The queue-mode example (examples/queue-mode.yaml and offtake_examples.jobs): the manifest
passes the CRD's rules and the loader, and the function does its work or names the bad field.
The example runs for real in tests/node/test_autoscaling_on_lag_seconds.py (queue mode)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from offtake import Record
from offtake.config import parse_pipeline
from offtake.config.crd_check import crd_problems

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "queue-mode.yaml"


def _load_jobs() -> Any:
    """This checkout's offtake_examples/jobs.py (the installed offtake_examples may be
    another checkout's, as in a shared virtual environment)."""
    spec = importlib.util.spec_from_file_location(
        "example_jobs", EXAMPLES / "offtake_examples/jobs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


handle = _load_jobs().handle


def job(value: object) -> Record:
    return Record("jobs", 0, 7, b"7", value, headers=(), timestamp=None)


def test_the_example_manifest_runs_in_queue_mode() -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    assert crd_problems(doc) == []
    spec = parse_pipeline(doc)
    assert spec.source.is_share_group
    assert spec.processor.function == "offtake_examples.jobs:handle"


def test_a_job_takes_the_time_it_says_and_is_marked_done() -> None:
    began = time.monotonic()
    assert handle(job({"id": 1, "seconds": 0.05})) == {"id": 1, "seconds": 0.05, "done": True}
    assert time.monotonic() - began >= 0.05


@pytest.mark.parametrize(
    ("value", "error"),
    [([1], "expected a JSON object, got list"), ({"seconds": 61}, "seconds: expected 0 to 60")],
)
def test_a_bad_job_names_what_is_wrong(value: object, error: str) -> None:
    with pytest.raises((TypeError, ValueError), match=error):
        handle(job(value))
