"""Helpers for the sidecar tests: reference processors as real subprocesses, and a scriptable
misbehaving sidecar (in a thread) for answers no honest processor gives."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from offtake.config.spec import ContainerSpec
from offtake_testbed._cache import cache_dir
from offtake_testbed.process import free_port, terminate

ROOT = Path(__file__).resolve().parents[2]
PY_REFERENCE = ROOT / "examples" / "sidecar" / "processor.py"
GO_REFERENCE = ROOT / "examples" / "sidecar" / "go"


def go_binary() -> Path | None:
    """The Go reference, built once per source version into the cache (None without Go)."""
    go = shutil.which("go") or "/usr/local/go/bin/go"  # where the Go tarball installs it
    if not Path(go).exists():
        return None
    source = (GO_REFERENCE / "main.go").read_bytes() + (GO_REFERENCE / "go.mod").read_bytes()
    binary = cache_dir("sidecar-go") / f"sidecar-{hashlib.sha256(source).hexdigest()[:16]}"
    if not binary.exists():
        tmp = binary.with_suffix(".tmp")
        # GOTOOLCHAIN=local: never download a toolchain (the module needs only the stdlib).
        env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}
        subprocess.run(
            [go, "build", "-o", str(tmp), "."], cwd=GO_REFERENCE, env=env, check=True, timeout=300
        )
        tmp.replace(binary)
    return binary


@dataclass
class Reference:
    """A reference processor running as a subprocess."""

    language: str
    port: int
    proc: subprocess.Popen[str]

    def stop(self) -> None:
        terminate(self.proc, 10)


@dataclass
class References:
    language: str
    started: list[Reference] = field(default_factory=list)

    def command(self, port: int, *args: str) -> list[str]:
        if self.language == "go":
            binary = go_binary()
            if binary is None:
                pytest.skip("go is not installed")
            # Go's flag package spells durations with a unit: --delay 2 becomes --delay 2s.
            args = tuple(
                f"{a}s" if i > 0 and args[i - 1] == "--delay" else a for i, a in enumerate(args)
            )
            return [str(binary), "--port", str(port), *args]
        return [sys.executable, str(PY_REFERENCE), "--port", str(port), *args]

    def start(self, *args: str, port: int | None = None) -> Reference:
        """Start a reference processor on ``port`` (default: a free one); wait until it listens."""
        port = port or free_port()
        proc = subprocess.Popen(self.command(port, *args), stdout=subprocess.PIPE, text=True)
        ref = Reference(self.language, port, proc)
        self.started.append(ref)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the socket listens
        assert "listening" in line, f"reference processor did not start: {line!r}"
        return ref

    def stop_all(self) -> None:
        for ref in self.started:
            ref.stop()


def spec(port: int, **kw: Any) -> ContainerSpec:
    given = {"path": "/v1/process", "timeout_seconds": 30.0, "max_batch_records": 500, **kw}
    return ContainerSpec(image="example", port=port, **given)


# -- a scriptable misbehaving sidecar --------------------------------------------------------

Answer = tuple[int, dict[str, str], bytes]
Script = Callable[[dict[str, Any]], Answer]


def ok(results: list[Any]) -> Answer:
    return 200, {}, json.dumps({"results": results}).encode()


class FakeSidecar:
    """An HTTP server whose answer to each POST is whatever ``script`` returns for the batch."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.batches: list[dict[str, Any]] = []
        self.health: Answer = (200, {}, b"ok")
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                fake.requests.append(("GET", self.path, dict(self.headers)))
                self.answer(fake.health)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                fake.requests.append(("POST", self.path, dict(self.headers)))
                batch = json.loads(body)
                fake.batches.append(batch)
                self.answer(fake.script(batch))

            def answer(self, answer: Answer) -> None:
                status, headers, data = answer
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)
