"""Liveness, readiness and the /metrics endpoint of a worker.

``Health`` is what the engine tells: ``heartbeat()`` on every poll-loop iteration and
``set_ready()`` when the group assignment is stable (and ``set_ready(False)`` as the very first
step of shutdown). ``MetricsServer`` serves it over HTTP on ``spec.metrics.port``:

- ``/metrics``: the worker's registry in the Prometheus text format;
- ``/healthz``: 200 while the poll loop polled within ``max.poll.interval.ms``, else 503. Past
  that budget Kafka itself has already evicted the consumer from the group, so a loop that is
  stuck that long is broken and the pod should be restarted;
- ``/readyz``: 200 only while ready: after the first partition assignment, before shutdown
  starts, and while the poll loop polled within :data:`READY_STALL_SECONDS` (a loop held up
  that long, say draining a revoke behind slow records, is not consuming: a rolling update
  should wait for it and a PodDisruptionBudget count it as unavailable).
- ``/drain`` (only with a drain token, sent in the ``X-Offtake-Drain-Token`` header): stop
  consuming, deliver and commit what is in flight, leave the group, then answer. An injected
  worker (``spec.mode: inject``) gets it from the application container's preStop hook, so the
  application stops only after the worker has drained through it.

The server is stdlib ``http.server`` in a daemon thread: scrapes and probes are tiny and rare,
and the worker must not need an event loop or extra dependency to serve them.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from offtake.metrics import Metrics

__all__ = ["DRAIN_TOKEN_HEADER", "READY_STALL_SECONDS", "Health", "MetricsServer"]

DRAIN_TOKEN_HEADER = "X-Offtake-Drain-Token"

READY_STALL_SECONDS = 10.0

log = logging.getLogger(__name__)


class Health:
    """Liveness from poll-loop heartbeats, readiness as the engine sets it. Thread-safe."""

    def __init__(
        self, max_poll_interval_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_poll_interval_s <= 0:
            raise ValueError(f"max_poll_interval_s must be positive, got {max_poll_interval_s}")
        self.max_poll_interval_s = max_poll_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        # Start-up counts as a heartbeat: a worker that never reaches its first poll within
        # the budget is as stuck as one that stopped polling.
        self._last_heartbeat = clock()
        self._ready = False
        self._ready_reason = "starting: no stable partition assignment yet"
        self._processor_down: str | None = None

    def heartbeat(self) -> None:
        """The poll loop ran an iteration; call it every iteration."""
        now = self._clock()
        with self._lock:
            self._last_heartbeat = now

    def set_processor_unavailable(self, reason: str | None) -> None:
        """The processor (a sidecar) does not answer: not ready, with why, until it does
        (None). Separate from set_ready: the poll loop owns that flag, the processing thread
        this one; readiness needs both."""
        with self._lock:
            self._processor_down = reason

    def set_ready(self, ready: bool, reason: str = "") -> None:
        """Ready when the assignment is stable; not ready (with why) from shutdown start."""
        with self._lock:
            self._ready = ready
            self._ready_reason = reason or ("ready" if ready else "not ready")

    def seconds_since_heartbeat(self) -> float:
        with self._lock:
            return self._clock() - self._last_heartbeat

    def liveness(self) -> tuple[bool, str]:
        """(alive, reason)."""
        age = self.seconds_since_heartbeat()
        if age > self.max_poll_interval_s:
            return False, (
                f"poll loop stuck: last poll {age:.1f}s ago, budget "
                f"(max.poll.interval.ms) {self.max_poll_interval_s:.1f}s"
            )
        return True, f"last poll {age:.1f}s ago"

    def readiness(self) -> tuple[bool, str]:
        """(ready, reason)."""
        age = self.seconds_since_heartbeat()
        with self._lock:
            if self._ready and age > READY_STALL_SECONDS:
                return False, (
                    f"poll loop stalled: last poll {age:.1f}s ago (ready again once it polls; "
                    f"not ready after {READY_STALL_SECONDS:.0f}s)"
                )
            if self._ready and self._processor_down is not None:
                return False, self._processor_down
            return self._ready, self._ready_reason


class _Handler(BaseHTTPRequestHandler):
    # Set per server by MetricsServer, so several workers in one process stay apart.
    metrics: Metrics
    health: Health
    #: (token, drain) when /drain is served: drain() blocks until drained, returns (ok, reason).
    drain: tuple[str, Callable[[], tuple[bool, str]]] | None
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/drain" and self.drain is not None:
            token, drain = self.drain
            # A token, not just the path: the metrics port is reachable from the whole cluster.
            if not hmac.compare_digest(self.headers.get(DRAIN_TOKEN_HEADER, ""), token):
                self._send(403, b"drain refused: wrong or missing drain token\n", "text/plain")
                return
            self._probe(*drain())
        elif path == "/metrics":
            self._send(200, generate_latest(self.metrics.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            self._probe(*self.health.liveness())
        elif path == "/readyz":
            self._probe(*self.health.readiness())
        else:
            self._send(404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain")

    def do_HEAD(self) -> None:
        self.do_GET()

    def _probe(self, ok: bool, reason: str) -> None:
        body: dict[str, Any] = {"status": "ok" if ok else "fail", "reason": reason}
        data = (json.dumps(body) + "\n").encode()
        self._send(200 if ok else 503, data, "application/json")

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # Probes and scrapes every few seconds would drown the worker's own logs on stderr.
        log.debug("%s " + format, self.address_string(), *args)


class MetricsServer:
    """Serves /metrics, /healthz and /readyz in a daemon thread. Port 0 picks a free port."""

    def __init__(
        self,
        metrics: Metrics,
        health: Health,
        port: int,
        host: str = "0.0.0.0",
        *,
        drain: tuple[str, Callable[[], tuple[bool, str]]] | None = None,
    ) -> None:
        self.metrics = metrics
        self.health = health
        self.drain = drain
        self.host = host
        self._requested_port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (the real one when constructed with port 0); valid after start()."""
        if self._server is None:
            raise RuntimeError("MetricsServer.port is known only after start()")
        return int(self._server.server_address[1])

    def start(self) -> MetricsServer:
        if self._server is not None:
            raise RuntimeError("MetricsServer already started")
        handler = type(
            "Handler",
            (_Handler,),
            {"metrics": self.metrics, "health": self.health, "drain": self.drain},
        )
        try:
            server = ThreadingHTTPServer((self.host, self._requested_port), handler)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"cannot serve metrics on {self.host}:{self._requested_port} "
                f"(spec.metrics.port): {exc.strerror}",
            ) from exc
        # Handler threads must not keep a finished worker process alive.
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"offtake-metrics-{self.port}",
            daemon=True,
        )
        self._thread.start()
        log.info("serving /metrics, /healthz and /readyz on %s:%d", self.host, self.port)
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
