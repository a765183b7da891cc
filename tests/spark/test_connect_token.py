"""submit.mode kubernetes's Connect server requires the pipeline's token: a real Spark Connect
server (the pyspark wheel's) started as the operator's SparkConnect starts it, with
``SPARK_CONNECT_AUTHENTICATE_TOKEN`` from the token Secret; the worker's session
(``OFFTAKE_SPARK_CONNECT_TOKEN``, what the Deployment's secretKeyRef sets) runs a query, and a
client without the token, or with another pipeline's, is refused before any plan runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.connect_token import ask

from .connect_server import ConnectServer

pytestmark = pytest.mark.spark
TOKEN = "pipeline-token-5f1d0c"


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

