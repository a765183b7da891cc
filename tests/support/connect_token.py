"""Asking a Spark Connect server with one token after another, as the worker connects.

The client runs ``offtake.sinks.spark.session._connect_session`` (the worker's own session:
its bearer-token channel and its retry policy) in a process of its own (a Connect session
switches the whole process's pyspark; one process for all tokens because importing pyspark
takes seconds), once per token, and prints each answer or refusal.

Every step is bounded, and a failure says which step: the server's port is first opened with
a plain TCP connect (no route, nothing listening), then each token gets its own deadline, so
a client that waits on a server that never answers fails naming its case ("no token",
"another pipeline's token", ...) and the client's log (pyspark's retries at debug level)
instead of hanging the test.
"""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Importing pyspark and the worker's modules; seconds on an idle machine.
START_TIMEOUT = 120.0
# One token's session and query. A refusal (UNAUTHENTICATED) is not retried by the client and
# answers in well under a second; the right token's query is one tiny job.
ATTEMPT_TIMEOUT = 90.0

CLIENT = """
import logging, os, sys
from offtake.sinks.spark.session import SessionConfig, _connect_session
logging.basicConfig(level=logging.INFO)  # the session's log lines, on stderr
cfg = SessionConfig(mode="kubernetes", master="", connect_url=sys.argv[1], app_name="t")
print("READY", flush=True)
for token in sys.argv[2:]:
    os.environ.pop("OFFTAKE_SPARK_CONNECT_TOKEN", None)
    if token != "-":
        os.environ["OFFTAKE_SPARK_CONNECT_TOKEN"] = token
    print("BEGIN", flush=True)
    session = _connect_session(cfg)
    try:
        print("ANSWER", session.sql("SELECT 41 + 1 AS x").collect()[0]["x"], flush=True)
    except Exception as exc:
        print("REFUSED", type(exc).__name__, " ".join(str(exc).split())[:600], flush=True)
    finally:
        session.stop()
"""


def port_open(url: str, timeout: float = 10.0) -> bool:
    """Whether a TCP connection to ``sc://host:port`` opens (a server's pod may run before
    its JVM listens: wait on this, then ask)."""
    parsed = urlparse(url.replace("sc://", "http://", 1))
    try:
        with socket.create_connection((parsed.hostname or "", parsed.port or 15002), timeout):
            return True
    except OSError:
        return False


def ask(
    url: str,
    cases: Sequence[tuple[str, str | None]],
    *,
    start_timeout: float = START_TIMEOUT,
    attempt_timeout: float = ATTEMPT_TIMEOUT,
) -> tuple[list[str], str]:
    """(one line per case: ``ANSWER 42`` or ``REFUSED <error>``, the client's log).

    ``cases`` are (what the case is, its token or None for none), asked in order."""
    env = {k: v for k, v in os.environ.items() if "CONNECT_AUTHENTICATE_TOKEN" not in k}
    env.pop("OFFTAKE_SPARK_CONNECT_TOKEN", None)
    env["SPARK_CONNECT_LOG_LEVEL"] = "debug"  # pyspark's retries, named in a failure's log
    tokens = [token or "-" for _, token in cases]
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", CLIENT, url, *tokens],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
        )  # fmt: skip
        lines: queue.Queue[str | None] = queue.Queue()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line.rstrip("\n"))
            lines.put(None)  # the client exited

        threading.Thread(target=read, daemon=True).start()

        def client_log(tail: int | None = 4000) -> str:
            log.seek(0)
            text = log.read()
            return text if tail is None else text[-tail:]

        def next_line(prefixes: tuple[str, ...], timeout: float, what: str) -> str:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    proc.kill()
                    proc.wait()
                    pytest.fail(
                        f"{what}: no answer from the Spark Connect client at {url} within "
                        f"{timeout:g}s; its log:\n{client_log()}",
                        pytrace=False,
                    )
                if line is None:
                    proc.wait()
                    pytest.fail(
                        f"{what}: the Spark Connect client exited {proc.returncode} first; "
                        f"its log:\n{client_log()}",
                        pytrace=False,
                    )
                if line.startswith(prefixes):
                    return line

        try:
            next_line(("READY",), start_timeout, "starting the client (importing pyspark)")
            answers = []
            for what, _ in cases:
                next_line(("BEGIN",), attempt_timeout, what)
                answers.append(next_line(("ANSWER", "REFUSED"), attempt_timeout, what))
            try:
                proc.wait(timeout=attempt_timeout)  # the last session's stop()
            except subprocess.TimeoutExpired:
                pytest.fail(
                    f"stopping the last session: the Spark Connect client at {url} did not exit "
                    f"within {attempt_timeout:g}s; its log:\n{client_log()}",
                    pytrace=False,
                )
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return answers, client_log(tail=None)
