"""submit.mode kubernetes's Connect server requires the pipeline's token: a real Spark Connect
server (the pyspark wheel's) started as the operator's SparkConnect starts it, with
``SPARK_CONNECT_AUTHENTICATE_TOKEN`` from the token Secret; the worker's session
(``OFFTAKE_SPARK_CONNECT_TOKEN``, what the Deployment's secretKeyRef sets) runs a query, and a
client without the token, or with another pipeline's, is refused before any plan runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.connect_token import ask

from .connect_server import ConnectServer

pytestmark = pytest.mark.spark
TOKEN = "pipeline-token-5f1d0c"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def token_server() -> Iterator[ConnectServer]:
    server = ConnectServer(env={"SPARK_CONNECT_AUTHENTICATE_TOKEN": TOKEN})
    try:
        server.start()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


def test_the_server_answers_only_the_pipelines_token(token_server: ConnectServer) -> None:
    (missing, wrong, right), _ = ask(
        token_server.url,
        [("no token", None), ("another pipeline's token", "another-pipelines-token"),
         ("the pipeline's token", TOKEN)],
    )  # fmt: skip
    assert right == "ANSWER 42"
    for answer in (missing, wrong):
        assert answer.startswith("REFUSED"), answer
        assert "UNAUTHENTICATED" in answer or "authentication" in answer.lower(), answer


def test_a_token_in_the_url_is_not_logged(token_server: ConnectServer) -> None:
    (answer,), log = ask(f"{token_server.url}/;token={TOKEN}", [("the pipeline's token", TOKEN)])
    assert answer == "ANSWER 42"
    # The address is logged, the token masked (offtake.redact, as on every log line).
    assert f"connecting to Spark Connect at {token_server.url}" in log, log
    assert TOKEN not in log


def _worker_job(url: str, token: str | None, path: Path) -> tuple[dict[str, Any], float]:
    """A SparkSink of submit.mode kubernetes (tests/spark/connect_job.py, a process of its own)
    given the server's URL and ``token`` as the Deployment gives them: (its summary, seconds)."""
    env = {k: v for k, v in os.environ.items() if "CONNECT_AUTHENTICATE_TOKEN" not in k}
    env.pop("OFFTAKE_SPARK_CONNECT_TOKEN", None)
    env["OFFTAKE_SPARK_CONNECT_URL"] = url
    if token is not None:
        env["OFFTAKE_SPARK_CONNECT_TOKEN"] = token
    spark = {"format": "parquet", "path": str(path), "submit": {"mode": "kubernetes"}}
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.connect_job",
         json.dumps({"spark": spark, "start": 0, "stop": 20})],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), time.monotonic() - began


@pytest.mark.parametrize(
    ("token", "says"),
    [
        ("another-pipelines-token", "$OFFTAKE_SPARK_CONNECT_TOKEN: the Spark Connect server at"),
        (None, "$OFFTAKE_SPARK_CONNECT_TOKEN: not set (key 'token' of the Secret"),
    ],
    ids=["another-token", "no-token"],
)
def test_a_refused_token_halts_the_sink_naming_the_setting(
    token_server: ConnectServer, tmp_path: Path, token: str | None, says: str
) -> None:
    # The server's UNAUTHENTICATED is neither an outage to wait out nor a fault of the batch:
    # no retries, no dead letters (the sink halts, the engine stops the pipeline whatever
    # errors.policy says), and an error that names where the token comes from.
    out, _ = _worker_job(token_server.url, token, tmp_path / "lake")
    assert (out["ok"], out["failed"]) == (0, 20), out
    (error,) = out["errors"]
    assert error.startswith("batch ") and says in error, error
    assert "'spark-test-spark-token'" in error and "UNAUTHENTICATED" in error, error
    assert TOKEN not in error
    assert not (tmp_path / "lake").exists() or not any((tmp_path / "lake").rglob("*.parquet"))
