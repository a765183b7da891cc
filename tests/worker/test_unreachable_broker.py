"""`offtake worker` against a port where nothing listens: not ready, then one error and exit 3.

Without a bound the worker retried forever and wrote each connection failure twice (librdkafka's
raw ``%3|...|FAIL|`` line and a JSON warning), many lines a second.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from offtake_testbed.process import free_port

CONNECT_TIMEOUT_S = 4


def offtake_command() -> list[str]:
    # The console script installed next to this interpreter: what a person types.
    script = Path(sys.executable).parent / "offtake"
    assert script.is_file(), f"no offtake console script beside {sys.executable}"
    return [str(script)]


def readyz(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None  # not serving yet, or already gone


def test_a_worker_gives_up_on_an_unreachable_broker_with_one_error_and_exit_code_3(
    tmp_path: Path,
) -> None:
    servers = f"127.0.0.1:{free_port()}"
    manifest = tmp_path / "pipeline.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "offtake.dev/v1alpha1",
                "kind": "ConsumerPipeline",
                "metadata": {"name": "nowhere", "namespace": "t"},
                "spec": {
                    "kafka": {
                        "bootstrapServers": servers,
                        "connectTimeoutSeconds": CONNECT_TIMEOUT_S,
                    },
                    "source": {"topics": ["orders"]},
                    "processor": {"function": "offtake_examples.enrich:handle"},
                    "sink": {"kafka": {"topic": "orders-enriched"}},
                    "errors": {"policy": "dlq", "dlq": {"topic": "orders-dlq"}},
                },
            }
        )
    )
    metrics_port = free_port()
    command = [*offtake_command(), "worker", "--pipeline", str(manifest)]
    worker = subprocess.Popen(
        [*command, "--metrics-port", str(metrics_port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # While it tries, the worker serves its probes and is not ready.
        statuses = set()
        while worker.poll() is None and not statuses:
            answer = readyz(metrics_port)
            if answer is not None:
                statuses.add(answer)
        out, err = worker.communicate(timeout=CONNECT_TIMEOUT_S + 60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert statuses == {503}
    assert worker.returncode == 3, err
    assert out == ""
    lines = err.splitlines()
    # Every line is one JSON object: no raw librdkafka syslog lines ("%3|...|FAIL|...").
    logs = [json.loads(line) for line in lines]
    errors = [entry for entry in logs if entry["level"] == "ERROR"]
    final = errors[-1]
    assert final["logger"] == "offtake.cli"
    assert f"no Kafka broker reachable at {servers}" in final["message"]
    assert "spec.kafka.connectTimeoutSeconds" in final["message"]
    assert "Connection refused" in final["message"]
    # librdkafka retries many times a second; its failure line is shown once per window.
    failures = [e for e in logs if e["logger"] == "offtake.librdkafka"]
    assert 1 <= len(failures) <= 2, failures
    assert not [e for e in logs if e["level"] == "WARNING"], "a failure logged twice"
    assert len(lines) <= 8, err
