"""`offtake validate`: the CRD's schema and CEL rules, the loader, and the function's import,
every problem reported, offline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.manifest_corpus import GOOD, corpus, minimal

from offtake.config.crd_check import crd_problems


@pytest.mark.parametrize(("case", "doc"), corpus(), ids=[c for c, _ in corpus()])
def test_the_crd_check_accepts_the_good_and_rejects_the_bad(case: str, doc: dict) -> None:
    problems = crd_problems(doc)
    if case in GOOD:
        assert problems == []
    else:
        assert problems, f"{case}: accepted"


def validate(tmp_path: Path, doc: dict) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(doc))
    return subprocess.run(
        [sys.executable, "-m", "offtake.cli", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_validate_reports_every_problem_not_only_the_first(tmp_path: Path) -> None:
    doc = minimal("9lives")
    doc["spec"]["processor"] = {"function": "no_such_module:handle"}
    doc["spec"]["errors"] = {"policy": "dlq"}
    doc["spec"]["limits"] = {"maxInFlightMessages": "lots"}
    result = validate(tmp_path, doc)
    assert result.returncode == 2, result
    assert "4 problem(s)" in result.stderr, result.stderr
    assert "metadata.name must be a DNS label" in result.stderr
    assert "errors.dlq.topic is required when errors.policy is dlq" in result.stderr
    assert "spec.limits.maxInFlightMessages: expected an integer" in result.stderr
    assert "cannot import module 'no_such_module'" in result.stderr
    assert "Traceback" not in result.stderr


def test_validate_says_ok_for_a_good_manifest(tmp_path: Path) -> None:
    result = validate(tmp_path, minimal())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok (pipeline default/p, sink log)")


def test_validate_says_where_the_function_runs_and_what_bounds_a_call(tmp_path: Path) -> None:
    doc = minimal()
    doc["spec"]["processor"] = {"function": "offtake_examples.enrich:handle"}
    default = validate(tmp_path, doc)
    assert default.returncode == 0, default.stderr
    assert "runs in the worker's thread: no timeoutSeconds" in default.stdout, default.stdout
    doc["spec"]["processor"].update(timeoutSeconds=2.5, maxMemoryMiB=256, parallelism=3)
    bounded = validate(tmp_path, doc)
    assert bounded.returncode == 0, bounded.stderr
    assert "runs in 3 pool process(es): timeoutSeconds 2.5" in bounded.stdout, bounded.stdout
    assert "maxMemoryMiB 256" in bounded.stdout


def test_function_bounds_without_a_function_are_refused_naming_the_field(
    tmp_path: Path,
) -> None:
    doc = minimal()
    doc["spec"]["processor"] = {"container": {"image": "x"}, "timeoutSeconds": 5}
    result = validate(tmp_path, doc)
    assert result.returncode == 2, result
    assert "spec.processor.timeoutSeconds: applies to processor.function" in result.stderr
    assert "processor.container.timeoutSeconds" in result.stderr  # the sidecar's own
    assert "Traceback" not in result.stderr


def test_yaml_errors_name_the_file_and_a_wrong_kind_is_named(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: ConsumerPipeline\nspec: [unclosed\n")
    result = subprocess.run(
        [sys.executable, "-m", "offtake.cli", "validate", str(broken)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2 and f'in "{broken}", line 2' in result.stderr
    result = validate(tmp_path, {**minimal(), "kind": "Deployment"})
    assert result.returncode == 2
    assert "other kinds in the file: 'Deployment'" in result.stderr


def test_odd_keys_and_huge_integers_are_problems_naming_the_field_not_tracebacks(
    tmp_path: Path,
) -> None:
    # Both found by tests/chaos/test_bad_manifests.py: a key holding "\r" garbled the problem
    # line, and an integer beyond 64 bits crashed the CEL check with a traceback.
    doc = minimal("odd")
    doc["spec"]["processor"] = {"\r": None}
    doc["spec"]["limits"] = {"maxInFlightMessages": 2**64}
    done = validate(tmp_path, doc)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "spec.processor.'\\r': unknown field" in done.stderr
    assert f"spec.limits.maxInFlightMessages: {2**64} is outside the 64-bit integer range" in (
        done.stderr
    )


def test_an_empty_config_key_is_a_problem_naming_it_not_a_crash_in_the_cel_check(
    tmp_path: Path,
) -> None:
    # "config:" with nothing after it is null in YAML; a CEL rule iterating it raised a bare
    # TypeError inside cel-python (found by tests/chaos/test_bad_manifests.py).
    doc = minimal("nullconfig")
    doc["spec"]["kafka"]["config"] = None
    doc["spec"]["sink"] = {"kafka": {"topic": "out", "config": {"\x1b": None}}}
    done = validate(tmp_path, doc)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "spec.kafka.config: " in done.stderr
    assert "spec.sink.kafka.config.'\\x1b': " in done.stderr


def test_validate_names_queue_mode_and_refuses_it_with_exactly_once(tmp_path: Path) -> None:
    doc = minimal()
    doc["spec"]["source"]["groupType"] = "share"
    ok = validate(tmp_path, doc)
    assert ok.returncode == 0, ok.stderr
    assert "source.groupType share: queue mode on share group default.p" in ok.stdout
    doc["spec"]["sink"] = {"kafka": {"topic": "out", "delivery": "exactly-once"}}
    refused = validate(tmp_path, doc)
    assert refused.returncode == 2, refused
    assert "spec.sink.kafka.delivery: exactly-once cannot be combined with " in refused.stderr
    assert "spec.source.groupType share" in refused.stderr


def test_validate_warns_when_a_call_outlives_the_share_groups_lock(tmp_path: Path) -> None:
    """issue 39 item 5: no RENEW in confluent-kafka, so a call longer than the lock leaves
    (30 s by default, released 5 s before it runs out) has its record processed twice."""
    doc = minimal()
    doc["spec"]["source"]["groupType"] = "share"
    doc["spec"]["processor"] = {"function": "json:dumps", "timeoutSeconds": 40}
    done = validate(tmp_path, doc)
    assert done.returncode == 0, done.stderr
    assert "warning: processor.timeoutSeconds 40 s is longer than" in done.stdout
    assert "unfinished 25 s after its poll" in done.stdout
    assert "share.record.lock.duration.ms" in done.stdout
    # Within the lock, or a consumer group (no lock): no warning.
    doc["spec"]["processor"]["timeoutSeconds"] = 25
    assert "warning" not in validate(tmp_path, doc).stdout
    doc["spec"]["processor"]["timeoutSeconds"] = 40
    doc["spec"]["source"]["groupType"] = "consumer"
    assert "warning" not in validate(tmp_path, doc).stdout
    # A sidecar's call: its own timeoutSeconds (30 s by default) counts the same way.
    doc["spec"]["source"]["groupType"] = "share"
    doc["spec"]["processor"] = {"container": {"image": "r/app:1", "timeoutSeconds": 50}}
    done = validate(tmp_path, doc)
    assert "warning: processor.container.timeoutSeconds 50 s is longer" in done.stdout
