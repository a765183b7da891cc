"""The registry set-ups the refusal tests share (issue 38 item 6): the real Apicurio serving
HTTPS only with HTTP basic auth, and a real HTTP proxy in front of it that refuses chosen
schema ids.

Apicurio here cannot answer 403 for one artifact: its path permissions are fixed when it is
built (every path needs an authenticated user, testbed/offtake_testbed/apicurio/install.py)
and its per-artifact authorization (owner-only) needs its OIDC mechanism, which the test bed
leaves out. So :class:`DenyingProxy` answers 403 for the schema ids a test denies, as a
registry with per-schema ACLs does, and forwards every other request as it came, the
client's credentials included: whether they are good is the real registry's to say (a wrong
password is its 401 for every request, the listing included).
"""

from __future__ import annotations

import http.client
import json
import re
import secrets
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from offtake_testbed._pki import CertificateAuthority
from offtake_testbed.apicurio import ApicurioRegistry, RegistryTls
from support.schemas import ORDER_AVRO, serializer

#: The one user of :func:`secured_registry`.
USER = "offtake-reader"
DENIED_BODY = {"error_code": 40301, "message": "User is denied operation Read on this schema"}
_BY_ID = re.compile(r"/schemas/ids/([0-9]+)")
# What the proxy passes on of a client's request: its credentials and what it accepts.
_FORWARDED = ("Authorization", "Accept")


def secured_registry(folder: Path) -> ApicurioRegistry:
    """An Apicurio (not started) that serves HTTPS only, with a certificate of a CA made in
    ``folder``, and answers only :data:`USER` with its password (``registry.users[USER]``)."""
    ca = CertificateAuthority("registry-test-ca")
    pair = ca.server("apicurio", ("127.0.0.1", "localhost"))
    (folder / "ca.crt").write_text(ca.cert_pem)
    (folder / "tls.crt").write_text(pair.cert_pem)
    (folder / "tls.key").write_text(pair.key_pem)
    return ApicurioRegistry(
        tls=RegistryTls(folder / "tls.crt", folder / "tls.key", folder / "ca.crt"),
        users={USER: secrets.token_urlsafe(16)},
    )


def registry_secret(root: Path, registry: ApicurioRegistry, password: str) -> Path:
    """A mounted ``registry-credentials`` Secret under ``root`` (username, password, ca.crt),
    as the operator mounts it; returns ``root``, the worker's secrets folder."""
    folder = root / "registry-credentials"
    folder.mkdir(parents=True)
    (folder / "username").write_text(USER)
    (folder / "password").write_text(password)
    assert registry.tls is not None
    (folder / "ca.crt").write_text(registry.tls.ca.read_text())
    return root


class DenyingProxy:
    """A real HTTP server in front of the registry: 403 for ``denied`` schema ids (or for
    every request while ``deny_all``), every other request forwarded as it came (to an HTTPS
    upstream verified with ``upstream_ca``)."""

    def __init__(self, upstream: str, upstream_ca: Path | None = None) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.denied: set[int] = set()
        self.deny_all = False
        self.requests: list[str] = []
        proxy = self
        context = ssl.create_default_context(cafile=str(upstream_ca)) if upstream_ca else None

        def connect() -> http.client.HTTPConnection:
            if proxy.upstream.scheme == "https":
                return http.client.HTTPSConnection(
                    proxy.upstream.netloc, timeout=30, context=context
                )
            return http.client.HTTPConnection(proxy.upstream.netloc, timeout=30)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                proxy.requests.append(self.path)
                found = _BY_ID.search(self.path)
                if proxy.deny_all or (found and int(found.group(1)) in proxy.denied):
                    self._answer(403, json.dumps(DENIED_BODY).encode())
                    return
                headers = {k: v for k in _FORWARDED if (v := self.headers.get(k)) is not None}
                conn = connect()
                try:
                    conn.request("GET", self.path, headers=headers)
                    got = conn.getresponse()
                    self._answer(got.status, got.read())
                finally:
                    conn.close()

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{self.upstream.path}"

    def __enter__(self) -> DenyingProxy:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def two_schemas(
    url: str, topic: str, client_conf: dict[str, str] | None = None
) -> tuple[Callable[[dict[str, Any]], bytes], Callable[[dict[str, Any]], bytes]]:
    """Encoders of two writer schemas with distinct ids (another team's, and ours);
    ``client_conf``: the registry client's (TLS, credentials)."""
    theirs = serializer(
        "avro", url, f"{topic}-theirs", {**ORDER_AVRO, "name": "TheirOrder"}, client_conf
    )
    ours = serializer("avro", url, topic, client_conf=client_conf)
    return theirs, ours
