"""A local HTTP service that answers each call after a set latency and counts the calls of one
key that overlap: the "other service" a concurrent processing function waits on
(bench/concurrency.py, and tests of ``processor.concurrency``).

    python -m offtake_testbed.latency_service [--latency-ms 20] [--port 0]

It binds 127.0.0.1 only and prints ``listening <port>`` once it accepts calls. HTTP/1.1 with
keep-alive, one request at a time per connection (no client here pipelines):

- ``GET /call?key=K[&ms=M]``: answers ``200 ok`` after the service's latency (or ``M`` ms).
  A call that starts while another call with the same ``K`` is still being answered counts as
  one overlap: in key order there must be none;
- ``GET /stats``: JSON of :class:`LatencyStats` (calls served, overlaps, calls in flight now
  and at most, distinct keys in flight at most, the latency);
- ``POST /reset?latency_ms=M``: zeroes the counters (and sets the latency), answers the
  stats from before.

Standard library only (asyncio streams), so that every contender's environment can use the
client half and the service starts without the project's dependencies.
:class:`LatencyService` runs it in its own process for a ``with`` block.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import asdict, dataclass
from typing import IO, Self
from urllib.parse import parse_qs, urlsplit

from ._service import Service

__all__ = ["LatencyService", "LatencyServiceError", "LatencyStats", "serve"]

_HOST = "127.0.0.1"
# A bench runs up to a few thousand connections at once (a thread or a pooled connection per
# call in flight): the listen backlog must take a burst of them.
_BACKLOG = 4096
_MAX_HEAD = 16 * 1024


class LatencyServiceError(RuntimeError):
    """The service did not start or answer; the message says why."""


@dataclass(frozen=True)
class LatencyStats:
    latency_ms: float
    served: int  # calls answered
    overlaps: int  # calls that started while another call of the same key was in flight
    in_flight: int  # calls being answered now
    in_flight_max: int  # calls being answered at once, at most
    keys_in_flight_max: int  # distinct keys being answered at once, at most


class _Counters:
    """What the service counts; one event loop owns it (no locks)."""

    def __init__(self, latency_ms: float) -> None:
        self.latency_ms = latency_ms
        self.served = 0
        self.overlaps = 0
        self.in_flight_max = 0
        self.keys_in_flight_max = 0
        # key -> calls in flight; a key leaves when its last call ends, so that the dict holds
        # only keys in flight whatever the number of keys seen.
        self.by_key: dict[str, int] = {}
        self.in_flight = 0

    def stats(self) -> LatencyStats:
        return LatencyStats(
            latency_ms=self.latency_ms,
            served=self.served,
            overlaps=self.overlaps,
            in_flight=self.in_flight,
            in_flight_max=self.in_flight_max,
            keys_in_flight_max=self.keys_in_flight_max,
        )

    def reset(self, latency_ms: float) -> None:
        self.latency_ms = latency_ms
        self.served = self.overlaps = 0
        self.in_flight_max = self.in_flight
        self.keys_in_flight_max = len(self.by_key)

    async def call(self, key: str, ms: float | None) -> None:
        held = self.by_key.get(key, 0)
        if held:
            self.overlaps += 1
        self.by_key[key] = held + 1
        self.in_flight += 1
        self.in_flight_max = max(self.in_flight_max, self.in_flight)
        self.keys_in_flight_max = max(self.keys_in_flight_max, len(self.by_key))
        try:
            await asyncio.sleep((self.latency_ms if ms is None else ms) / 1000)
        finally:
            self.in_flight -= 1
            left = self.by_key[key] - 1
            if left:
                self.by_key[key] = left
            else:
                del self.by_key[key]
            self.served += 1


def _response(status: str, body: bytes, content_type: str = "text/plain") -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


_OK = _response("200 OK", b"ok")


async def _answer(counters: _Counters, method: str, target: str) -> bytes:
    url = urlsplit(target)
    query = parse_qs(url.query)
    if url.path == "/call":
        keys = query.get("key")
        if not keys:
            return _response("400 Bad Request", b"a call needs ?key=")
        ms = query.get("ms")
        await counters.call(keys[0], float(ms[0]) if ms else None)
        return _OK
    if url.path == "/stats":
        body = json.dumps(asdict(counters.stats())).encode()
        return _response("200 OK", body, "application/json")
    if url.path == "/reset" and method == "POST":
        before = counters.stats()
        latency = query.get("latency_ms")
        counters.reset(float(latency[0]) if latency else counters.latency_ms)
        return _response("200 OK", json.dumps(asdict(before)).encode(), "application/json")
    return _response("404 Not Found", b"unknown path")


async def _connection(
    counters: _Counters, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ")
            if len(parts) != 3:
                writer.write(_response("400 Bad Request", b"bad request line"))
                return
            method, target, version = parts
            length, close = 0, version == "HTTP/1.0"
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value.strip() or 0)
                elif name == "connection":
                    close = value.strip().lower() == "close"
            if length:
                await reader.readexactly(length)  # a body is allowed and ignored
            try:
                answer = await _answer(counters, method, target)
            except ValueError as exc:
                answer = _response("400 Bad Request", str(exc).encode())
            writer.write(answer)
            await writer.drain()
            if close:
                return
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()


async def serve(latency_ms: float, port: int = 0, announce: bool = True) -> None:
    """Serve on 127.0.0.1:``port`` (0: a free one) until cancelled; prints the port first."""
    counters = _Counters(latency_ms)
    server = await asyncio.start_server(
        lambda r, w: _connection(counters, r, w),
        _HOST,
        port,
        backlog=_BACKLOG,
        limit=_MAX_HEAD,
    )
    bound = server.sockets[0].getsockname()[1]
    if announce:
        print(f"listening {bound}", flush=True)
    async with server:
        await server.serve_forever()


def fetch_json(url: str, method: str = "GET", timeout: float = 10.0) -> dict[str, object]:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        loaded: dict[str, object] = json.loads(answer.read())
        return loaded


def _stats(doc: dict[str, object]) -> LatencyStats:
    return LatencyStats(**doc)  # type: ignore[arg-type]


class LatencyService(Service):
    """The service in its own process (its own interpreter, its own event loop and core), for
    a ``with`` block: ``url``, ``stats()``, ``reset()``."""

    def __init__(self, latency_ms: float = 20.0, start_timeout: float = 60.0) -> None:
        self.latency_ms = latency_ms
        self.start_timeout = start_timeout
        self._process: subprocess.Popen[str] | None = None
        self._stderr: IO[str] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{_HOST}:{self.port}"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise LatencyServiceError("the latency service is not running")
        return self._process.pid

    def start(self) -> Self:
        argv = [sys.executable, "-m", "offtake_testbed.latency_service"]
        argv += ["--latency-ms", str(self.latency_ms)]
        # Its errors go to a file, not a pipe nobody reads (a full pipe would block it).
        self._stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed by stop())
        self._process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=self._stderr, text=True
        )
        assert self._process.stdout is not None
        # The first line is the port; reading it is the readiness check: the child prints it
        # or exits (then the read ends with an empty line).
        line = self._process.stdout.readline()
        if not line.startswith("listening "):
            self._process.wait(self.start_timeout)
            self._stderr.seek(0)
            err = self._stderr.read()[-2000:]
            self.stop()
            raise LatencyServiceError(f"the latency service did not start: {line}{err}")
        self.port = int(line.split()[1])
        return self

    def stats(self) -> LatencyStats:
        return _stats(fetch_json(f"{self.url}/stats"))

    def reset(self, latency_ms: float | None = None) -> LatencyStats:
        """Zero the counters (and set the latency); the stats from before."""
        query = f"?latency_ms={latency_ms}" if latency_ms is not None else ""
        return _stats(fetch_json(f"{self.url}/reset{query}", method="POST"))

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        if process.stdout is not None:
            process.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.latency_ms, args.port))


if __name__ == "__main__":
    main()
