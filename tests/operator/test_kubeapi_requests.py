"""What the operator's API client sends on the wire: the server-side apply's field manager, the
uid precondition of a delete, the login's credentials, one kept-alive connection, and errors
that name the request."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes.client
import pytest

from offtake_operator.kubeapi import (
    CAUSE_TEXT_LIMIT,
    CAUSES_KEPT,
    DEPLOYMENTS,
    JOBS,
    ApiError,
    Cause,
    KubeApi,
)


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    #: The client's port: the same port twice is the same connection.
    port: int


@dataclass
class FakeApiServer:
    """Answers every request with ``answer`` (status, JSON body) and records it."""

    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    answer: tuple[int, Any] = (200, {"kind": "Deployment", "metadata": {"name": "d"}})


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    fake = FakeApiServer()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the API server does

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            fake.seen.append(
                Seen(
                    self.command,
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    json.loads(raw) if raw else None,
                    self.client_address[1],
                )
            )
            status, body = fake.answer
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = do_DELETE = do_POST = _serve

        def log_message(self, *_: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        httpd.shutdown()
        httpd.server_close()


def logged_in(url: str) -> KubeApi:
    configuration = kubernetes.client.Configuration(host=url)
    configuration.api_key = {"BearerToken": "Bearer the-token"}
    api = KubeApi(timeout=5)
    api.use(configuration)
    return api


def test_apply_is_a_forced_server_side_apply_as_offtakes_field_manager(
    server: FakeApiServer,
) -> None:
    body = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}

    async def run() -> Any:
        api = logged_in(server.url)
        try:
            return await api.apply(DEPLOYMENTS, "ns", "d", body)
        finally:
            await api.close()

    assert asyncio.run(run()) == server.answer[1]
    (seen,) = server.seen
    assert seen.method == "PATCH"
    assert seen.path == "/apis/apps/v1/namespaces/ns/deployments/d?fieldManager=offtake&force=true"
    assert seen.headers["content-type"] == "application/apply-patch+yaml"
    assert seen.headers["authorization"] == "Bearer the-token"
    assert seen.body == body


def test_a_delete_carries_the_uid_precondition_and_a_changed_uid_deletes_nothing(
    server: FakeApiServer,
) -> None:
    async def run() -> list[bool]:
        api = logged_in(server.url)
        try:
            deleted = await api.delete(JOBS, "ns", "j", uid="u-1", propagation="Background")
            server.answer = (409, {"kind": "Status", "reason": "Conflict", "message": "uid"})
            refused = await api.delete(JOBS, "ns", "j", uid="u-1")
            server.answer = (404, {"kind": "Status", "reason": "NotFound", "message": "gone"})
            gone = await api.delete(JOBS, "ns", "j")
            return [deleted, refused, gone]
        finally:
            await api.close()

    assert asyncio.run(run()) == [True, False, False]
    first = server.seen[0]
    assert (first.method, first.path) == ("DELETE", "/apis/batch/v1/namespaces/ns/jobs/j")
    assert first.body == {"propagationPolicy": "Background", "preconditions": {"uid": "u-1"}}


def test_calls_reuse_one_connection(server: FakeApiServer) -> None:
    async def run() -> None:
        api = logged_in(server.url)
        try:
            for _ in range(5):
                await api.get(DEPLOYMENTS, "ns", "d")
        finally:
            await api.close()

    asyncio.run(run())
    assert len(server.seen) == 5
    assert len({s.port for s in server.seen}) == 1


def test_an_error_names_the_request_and_the_servers_reason(server: FakeApiServer) -> None:
    server.answer = (
        422,
        {"kind": "Status", "reason": "Invalid", "message": 'Deployment "d" is invalid: spec'},
    )

    async def run() -> None:
        api = logged_in(server.url)
        try:
            await api.apply(DEPLOYMENTS, "ns", "d", {"metadata": {"name": "d"}})
        finally:
            await api.close()

    with pytest.raises(ApiError) as caught:
        asyncio.run(run())
    assert (caught.value.status, caught.value.reason) == (422, "Invalid")
    assert str(caught.value) == (
        "PATCH /apis/apps/v1/namespaces/ns/deployments/d: 422 Invalid: "
        'Deployment "d" is invalid: spec'
    )
    assert not caught.value.retriable


def test_an_errors_causes_are_kept_bounded_whatever_the_answer_holds(
    server: FakeApiServer,
) -> None:
    """The causes name the refused fields; an answer relayed from an admission webhook may
    hold any number of them, of any length: CAUSES_KEPT, each cut to CAUSE_TEXT_LIMIT."""
    env = "spec.template.spec.containers[0].env[0].name"
    flood = [{"field": "f" * 10_000, "message": "m" * 10_000}] * 5_000
    answers = [
        [{"reason": "FieldValueRequired", "message": "Required value", "field": env}],
        flood,
    ]
    caught: list[ApiError] = []

    async def run() -> None:
        api = logged_in(server.url)
        try:
            for causes in answers:
                body = {"reason": "Invalid", "message": "m", "details": {"causes": causes}}
                server.answer = (422, body)
                try:
                    await api.apply(DEPLOYMENTS, "ns", "d", {"metadata": {"name": "d"}})
                except ApiError as exc:
                    caught.append(exc)
        finally:
            await api.close()

    asyncio.run(run())
    assert caught[0].causes == (Cause(env, "Required value", "FieldValueRequired"),)
    assert len(caught[1].causes) == CAUSES_KEPT
    assert {len(c.field) for c in caught[1].causes} == {CAUSE_TEXT_LIMIT}
    assert {len(c.message) for c in caught[1].causes} == {CAUSE_TEXT_LIMIT}


def test_a_call_before_the_login_says_so() -> None:
    async def run() -> None:
        api = KubeApi()
        try:
            await api.get(DEPLOYMENTS, "ns", "d")
        finally:
            await api.close()

    with pytest.raises(RuntimeError, match="not logged in"):
        asyncio.run(run())
