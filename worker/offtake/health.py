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
- ``/drain`` (only when the worker is started with one, and only from the pod itself): stop
  consuming, deliver and commit what is in flight, leave the group, then answer. An injected
  worker (``spec.mode: inject``) gets it from the application container's preStop hook, so the
  application stops only after the worker has drained through it.

Who may drain: a peer on loopback (the pod's own containers share its network namespace:
``offtake drain`` run inside the worker container, or the application) or one of
``drain_from``, the addresses the pod's node speaks from (the kubelet runs an ``httpGet``
preStop hook from the host network; :func:`node_addresses`). Any other peer gets 403: the port
is reachable from the whole cluster for probes and scrapes, and a drain stops the worker.
There is no token: one a preStop hook sends would sit in the pod spec, readable by anyone
with ``get pods`` (docs/security.md).

The server is stdlib ``http.server`` in daemon threads: scrapes and probes are tiny and rare,
and the worker must not need an event loop or extra dependency to serve them. Because the
port is open to the cluster, it is hardened against clients that hold connections:

- a socket idle (or trickling) longer than :data:`IDLE_TIMEOUT_SECONDS` is closed, and a
  request whose line and headers have not all arrived within :data:`HEADER_DEADLINE_SECONDS`
  is cut off (a slowloris client sending a byte every few seconds holds no thread for long);
- at most :data:`MAX_CONNECTIONS` connections are served at once; one more is answered 503 and
  closed at once, so probes keep a thread when a client opens many;
- a request line over :data:`MAX_REQUEST_LINE` bytes gets 414, headers over
  :data:`MAX_HEADER_BYTES` get 431, and a request with a body gets 413 (nothing here takes one).

The kubelet's probes have a listener of their own (``probes_only``: ``/healthz`` and
``/readyz``, nothing else; the operator starts it with ``--probe-port`` on
``spec.metrics.probePort``). The cap above keeps the worker's threads bounded, but it is a
cap anyone who reaches the metrics port can fill: 16 slow clients and every further
connection gets 503, probes included, and the kubelet restarts a healthy worker. Reserving
slots for probe paths inside one listener does not work, because a connection's path is known
only after its request line has arrived, and a flood can send ``GET /healthz`` slowly as well.
A second port separates them by where the connection arrives: the worker's NetworkPolicy
admits other pods to the metrics port only, the kubelet reaches the probe port from the node,
and the probe listener has its own slots and deadlines should a flood reach it anyway.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from offtake.metrics import Metrics

__all__ = [
    "DRAIN_ENV",
    "HEADER_DEADLINE_SECONDS",
    "IDLE_TIMEOUT_SECONDS",
    "MAX_CONNECTIONS",
    "NODE_IPS_ENV",
    "PROBE_PATHS",
    "READY_STALL_SECONDS",
    "Health",
    "MetricsServer",
    "node_addresses",
]

READY_STALL_SECONDS = 10.0

#: A connection silent this long is closed (also between keep-alive requests: Prometheus
#: opens a new one per scrape at worst, probes do anyway).
IDLE_TIMEOUT_SECONDS = 10.0
#: The request line and headers must all have arrived this long after the first byte was
#: awaited; the idle timeout alone lets a client trickle a byte every few seconds forever.
HEADER_DEADLINE_SECONDS = 10.0
#: Connections served at once: probes, a scrape or two and a drain need a handful.
MAX_CONNECTIONS = 16
MAX_REQUEST_LINE = 2048
#: What the probe listener serves.
PROBE_PATHS = frozenset({"/healthz", "/readyz"})
MAX_HEADER_BYTES = 8192
#: Set (to anything) to serve /drain: the operator sets it on injected workers.
DRAIN_ENV = "OFFTAKE_DRAIN"
#: The pod's node addresses, comma-separated (the injected worker gets status.hostIPs through
#: the downward API): where the kubelet's preStop httpGet comes from.
NODE_IPS_ENV = "OFFTAKE_NODE_IPS"

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


def _default_gateways(route_table: Path = Path("/proc/net/route")) -> set[str]:
    """The IPv4 default gateways of this network namespace: on a bridge CNI the host (and so
    the kubelet) reaches a pod from the bridge's address, which is the pod's gateway."""
    found: set[str] = set()
    try:
        lines = route_table.read_text().splitlines()[1:]
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000" and fields[2] != "00000000":
            found.add(socket.inet_ntoa(int(fields[2], 16).to_bytes(4, "little")))
    return found


def node_addresses(node_ips: str) -> frozenset[str]:
    """The addresses a drain may come from besides loopback: the node's (``node_ips``, comma
    separated: the CLI reads ``$OFFTAKE_NODE_IPS``) and the pod's default gateway, the two a
    kubelet's hook is seen from across CNIs."""
    given = {a.strip() for a in node_ips.split(",") if a.strip()}
    return frozenset(given | _default_gateways())


def _is_loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool((mapped or ip).is_loopback)


class _Handler(BaseHTTPRequestHandler):
    # Set per server by MetricsServer, so several workers in one process stay apart.
    metrics: Metrics
    health: Health
    #: drain() blocks until drained and returns (ok, reason); None: /drain is not served.
    drain: Callable[[], tuple[bool, str]] | None
    #: Non-loopback peers that may drain (the node's addresses).
    drain_from: frozenset[str]
    #: Serve /healthz and /readyz only: the kubelet's probe listener.
    probes_only: bool = False
    protocol_version = "HTTP/1.1"
    #: StreamRequestHandler sets it on the socket: every read and write waits at most this.
    timeout = IDLE_TIMEOUT_SECONDS
    header_deadline = HEADER_DEADLINE_SECONDS
    _reading_headers = False

    def handle_one_request(self) -> None:
        # The deadline for the request line and headers; parse_request ends it once they are in.
        self._reading_headers = True
        timer = threading.Timer(self.header_deadline, self._cut_slow_client)
        timer.daemon = True
        timer.start()
        try:
            super().handle_one_request()
        finally:
            timer.cancel()

    def _cut_slow_client(self) -> None:
        if self._reading_headers:
            log.debug(
                "%s: request not complete within %.0fs, closed",
                self.address_string(),
                self.header_deadline,
            )
            self.close_connection = True
            with contextlib.suppress(OSError):  # the client left meanwhile
                self.connection.shutdown(socket.SHUT_RDWR)

    def parse_request(self) -> bool:
        # raw_requestline: set by handle_one_request before it calls this (not in typeshed).
        line: bytes = getattr(self, "raw_requestline", b"")
        if len(line) > MAX_REQUEST_LINE:
            self.requestline, self.command, self.request_version = "", "", "HTTP/1.1"
            self._reading_headers = False
            self.send_error(414, f"request line longer than {MAX_REQUEST_LINE} bytes")
            return False
        ok = super().parse_request()
        self._reading_headers = False
        if not ok:
            return False
        if sum(len(k) + len(v) + 4 for k, v in self.headers.items()) > MAX_HEADER_BYTES:
            self.send_error(431, f"headers longer than {MAX_HEADER_BYTES} bytes")
            return False
        if self.headers.get("Content-Length", "0") not in ("", "0") or self.headers.get(
            "Transfer-Encoding"
        ):
            self.send_error(413, "this server takes no request body")
            return False
        return True

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if self.probes_only and path not in PROBE_PATHS:
            self._send(404, b"not found: this port serves /healthz and /readyz\n", "text/plain")
        elif path == "/drain" and self.drain is not None:
            peer = str(self.client_address[0])
            if not (_is_loopback(peer) or peer.split("%", 1)[0] in self.drain_from):
                log.warning("refused /drain from %s: only the pod itself may drain", peer)
                self._send(
                    403,
                    f"drain refused: only the pod itself may drain, not {peer}\n".encode(),
                    "text/plain",
                )
                return
            self._probe(*self.drain())
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


class _BoundedServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that serves at most :data:`MAX_CONNECTIONS` at once."""

    daemon_threads = True  # handler threads must not keep a finished worker process alive
    max_connections = MAX_CONNECTIONS

    def server_activate(self) -> None:
        super().server_activate()
        self._slots = threading.BoundedSemaphore(self.max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            # No thread for it: a short answer and close, so the client does not retry into
            # a hung socket and the slots' holders are not disturbed.
            try:
                request.settimeout(1.0)
                request.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                    b"Connection: close\r\n\r\n"
                )
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class MetricsServer:
    """Serves /metrics, /healthz and /readyz in a daemon thread. Port 0 picks a free port.

    ``drain`` (blocks until drained, returns (ok, reason)) turns /drain on, for peers on
    loopback and in ``drain_from`` only. ``probes_only``: serve /healthz and /readyz and
    nothing else (the probe listener, with connection slots of its own)."""

    def __init__(
        self,
        metrics: Metrics,
        health: Health,
        port: int,
        host: str = "0.0.0.0",
        *,
        drain: Callable[[], tuple[bool, str]] | None = None,
        drain_from: Iterable[str] = (),
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout: float = IDLE_TIMEOUT_SECONDS,
        header_deadline: float = HEADER_DEADLINE_SECONDS,
        probes_only: bool = False,
    ) -> None:
        if probes_only and drain is not None:
            raise ValueError("the probe listener does not serve /drain")
        self.probes_only = probes_only
        self.metrics = metrics
        self.health = health
        self.drain = drain
        self.drain_from = frozenset(drain_from)
        self.max_connections = max_connections
        self.idle_timeout, self.header_deadline = idle_timeout, header_deadline
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
            {
                "metrics": self.metrics,
                "health": self.health,
                # staticmethod: a plain function as a class attribute would bind to the handler.
                "drain": None if self.drain is None else staticmethod(self.drain),
                "drain_from": self.drain_from,
                "timeout": self.idle_timeout,
                "header_deadline": self.header_deadline,
                "probes_only": self.probes_only,
            },
        )
        bounded = type("Server", (_BoundedServer,), {"max_connections": self.max_connections})
        try:
            server = bounded((self.host, self._requested_port), handler)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"cannot serve {'probes' if self.probes_only else 'metrics'} on "
                f"{self.host}:{self._requested_port} "
                f"({'spec.metrics.probePort' if self.probes_only else 'spec.metrics.port'}): "
                f"{exc.strerror}",
            ) from exc
        self._server = server
        what = "probes" if self.probes_only else "metrics"
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"offtake-{what}-{self.port}",
            daemon=True,
        )
        self._thread.start()
        log.info(
            "serving %s on %s:%d",
            "/healthz and /readyz" if self.probes_only else "/metrics, /healthz and /readyz",
            self.host,
            self.port,
        )
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
