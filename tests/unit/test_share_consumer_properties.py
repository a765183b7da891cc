"""Queue mode (source.groupType share): every client property a share consumer refuses or
ignores is refused by the CRD (CEL, as `offtake validate` evaluates it), by the loader, by
`offtake validate` and by the worker (kafka.config and the Kafka Secret it merges), each naming
the key and what the share group uses instead. That librdkafka really refuses them is
tests/worker/test_share_consumer_properties_on_kafka.py."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.manifest_corpus import minimal

from offtake.cli import main as offtake_main
from offtake.config import ConfigError, parse_pipeline
from offtake.config.client_properties import SHARE_IGNORED, SHARE_REFUSED, share_refused_reason
from offtake.config.crd_check import crd_node, crd_problems
from offtake.kafka.config import check_share_properties, share_consumer_config

KEYS = [*SHARE_REFUSED, *SHARE_IGNORED]


def queue_mode(config: dict[str, Any]) -> dict[str, Any]:
    doc = minimal()
    doc["spec"]["source"]["groupType"] = "share"
    doc["spec"]["kafka"]["config"] = {"linger.ms": "5", **config}
    return doc


def instead(key: str) -> str:
    reason = share_refused_reason(key)
    assert reason is not None
    return reason.split("instead: ", 1)[1]


@pytest.mark.parametrize("key", KEYS)
def test_the_crd_and_the_loader_refuse_it_naming_the_key_and_what_to_use(key: str) -> None:
    doc = queue_mode({key: "1"})
    (problem,) = crd_problems(copy.deepcopy(doc))
    assert f'kafka.config["{key}"] cannot be set with source.groupType share' in problem
    assert instead(key) in problem, problem
    with pytest.raises(ConfigError) as err:
        parse_pipeline(copy.deepcopy(doc))
    message = str(err.value)
    assert message.startswith(f'spec.kafka.config["{key}"]: cannot be set with'), message
    assert instead(key) in message


def test_a_consumer_group_keeps_them() -> None:
    doc = queue_mode(dict.fromkeys(KEYS, "1"))
    doc["spec"]["source"]["groupType"] = "consumer"
    assert not [p for p in crd_problems(doc) if "groupType share" in p]


def test_what_a_share_consumer_takes_passes() -> None:
    doc = queue_mode({"fetch.max.bytes": "1048576", "fetch.wait.max.ms": "100"})
    assert crd_problems(copy.deepcopy(doc)) == []
    parse_pipeline(doc)


def test_the_crd_lists_exactly_the_workers_keys_with_the_same_reasons() -> None:
    """One list: the CEL rule's map is the Python tables' keys and reasons, in that order."""
    rules = crd_node("spec")["x-kubernetes-validations"]
    (rule,) = [r for r in rules if "kafka.config.all(k, !(k in {" in r["rule"]]
    pairs = re.findall(r"'([^']+)': '([^']+)'", rule["rule"].split("k in ", 1)[1])
    assert pairs == [(k, share_refused_reason(k)) for k in KEYS]


def test_the_issue_s_manifest_is_refused_by_offtake_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """issue 39: session.timeout.ms and heartbeat.interval.ms validated "ok", then exit 3."""
    path = tmp_path / "pipeline.yaml"
    doc = queue_mode({"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    path.write_text(yaml.safe_dump(doc))
    assert offtake_main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    # The first key in the manifest's order (safe_dump sorts them), with what to use instead.
    assert 'spec.kafka.config["heartbeat.interval.ms"]: cannot be set with' in err
    assert "share.heartbeat.interval.ms" in err
    assert "ok" not in capsys.readouterr().out


@pytest.mark.parametrize("key", KEYS)
def test_the_worker_refuses_it_from_the_kafka_secret(key: str) -> None:
    spec = parse_pipeline(queue_mode({}))
    with pytest.raises(ConfigError) as err:
        check_share_properties(spec, {"sasl.username": "u", key: "1"})
    assert str(err.value).startswith(f'spec.kafka.secretRef["{key}"]: cannot be set with')
    assert instead(key) in str(err.value)


def test_the_worker_process_exits_2_naming_a_secret_key(tmp_path: Path) -> None:
    """A mounted Kafka Secret is merged by the worker only: it refuses before any client."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "session.timeout.ms").write_text("6000")
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(queue_mode({})))
    done = subprocess.run(
        [sys.executable, "-m", "offtake.cli", "worker", "--pipeline", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "OFFTAKE_KAFKA_SECRET_DIR": str(secret)},
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert 'spec.kafka.secretRef["session.timeout.ms"]: cannot be set with' in done.stderr
    assert "Traceback" not in done.stderr


def test_the_share_consumer_config_refuses_a_spec_built_in_code(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import dataclasses

    monkeypatch.setenv("OFFTAKE_KAFKA_SECRET_DIR", str(tmp_path))
    spec = parse_pipeline(queue_mode({}))
    spec = dataclasses.replace(
        spec, kafka=dataclasses.replace(spec.kafka, config={"group.instance.id": "w-0"})
    )
    with pytest.raises(ConfigError, match=r'spec\.kafka\.config\["group\.instance\.id"\]'):
        share_consumer_config(spec)
