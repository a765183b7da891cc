"""submit.mode kubernetes's Connect server requires the pipeline's token: a real Spark Connect
server (the pyspark wheel's) started as the operator's SparkConnect starts it, with
``SPARK_CONNECT_AUTHENTICATE_TOKEN`` from the token Secret; the worker's session
(``OFFTAKE_SPARK_CONNECT_TOKEN``, what the Deployment's secretKeyRef sets) runs a query, and a
client without the token, or with another pipeline's, is refused before any plan runs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .connect_server import ConnectServer

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "pipeline-token-5f1d0c"

# Connects as the worker does (session._connect_session), once per token given (none: "-"),
# in a process of its own (a Connect session switches the whole process's pyspark; one process
# for all tokens because importing pyspark takes seconds), and prints each answer or error.
CLIENT = """
import logging, os, sys
from offtake.sinks.spark.session import SessionConfig, _connect_session
logging.basicConfig(level=logging.INFO)  # the session's log lines, on stderr
cfg = SessionConfig(mode="kubernetes", master="", connect_url=sys.argv[1], app_name="t")
for token in sys.argv[2:]:
    os.environ.pop("OFFTAKE_SPARK_CONNECT_TOKEN", None)
    if token != "-":
        os.environ["OFFTAKE_SPARK_CONNECT_TOKEN"] = token
    session = _connect_session(cfg)
    try:
        print("ANSWER", session.sql("SELECT 41 + 1 AS x").collect()[0]["x"], flush=True)
    except Exception as exc:
        print("REFUSED", type(exc).__name__, " ".join(str(exc).split())[:600], flush=True)
    finally:
        session.stop()
"""


@pytest.fixture(scope="module")
def token_server() -> Iterator[ConnectServer]:
    server = ConnectServer(env={"SPARK_CONNECT_AUTHENTICATE_TOKEN": TOKEN})
    try:
        server.start()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


def client(url: str, *tokens: str | None) -> tuple[list[str], str]:
    """(one answer per token, the client's log)."""
    env = {k: v for k, v in os.environ.items() if "CONNECT_AUTHENTICATE_TOKEN" not in k}
    env.pop("OFFTAKE_SPARK_CONNECT_TOKEN", None)
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, url, *(t or "-" for t in tokens)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith(("ANSWER", "REFUSED"))]
    assert len(lines) == len(tokens), done.stdout[-2000:] + done.stderr[-3000:]
    return lines, done.stderr


def test_the_server_answers_only_the_pipelines_token(token_server: ConnectServer) -> None:
    (missing, wrong, right), _ = client(token_server.url, None, "another-pipelines-token", TOKEN)
    assert right == "ANSWER 42"
    for answer in (missing, wrong):
        assert answer.startswith("REFUSED"), answer
        assert "UNAUTHENTICATED" in answer or "authentication" in answer.lower(), answer


def test_a_token_in_the_url_is_not_logged(token_server: ConnectServer) -> None:
    (answer,), log = client(f"{token_server.url}/;token={TOKEN}", TOKEN)
    assert answer == "ANSWER 42"
    # The address is logged, the token masked (offtake.redact, as on every log line).
    assert f"connecting to Spark Connect at {token_server.url}" in log, log
    assert TOKEN not in log
