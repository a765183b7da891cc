"""The worker's health port is open to the whole cluster: attacks on it over real TCP.

A slowloris client (bytes trickled, or none at all) is cut off after the deadline while other
clients are answered; connections past the cap get 503 at once, and a slot frees when a holder
goes; while slow clients hold every slot of the metrics port, the probe listener answers every
probe at once, and serves nothing but probes; oversized request lines and headers and request
bodies are refused with their status; ``/drain`` is refused to any peer that is not loopback
or the node, and served to loopback. Timeouts are shortened per server so the file runs in seconds.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from offtake.health import Health, MetricsServer
from offtake.metrics import Metrics

IDLE, DEADLINE = 1.0, 1.5


def outside_address() -> str:
    """A non-loopback address of this host: a peer from it is seen as coming from the network."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.250", 9))  # a route lookup only: nothing is sent
        address = str(s.getsockname()[0])
    assert not address.startswith("127."), f"this host has no non-loopback address: {address}"
    return address


def get(port: int, path: str, host: str = "127.0.0.1") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def raw(port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection and read the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the server closed ``sock`` (reads EOF or a reset); fails past ``seconds``."""
    began = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {seconds} s")
    return time.monotonic() - began


@pytest.fixture
def drained() -> list[str]:
    return []


@pytest.fixture
def server(drained: list[str]) -> Iterator[MetricsServer]:
    health = Health(max_poll_interval_s=60)
    health.set_ready(True)

    def drain() -> tuple[bool, str]:
        drained.append("drained")
        return True, "drained"

    srv = MetricsServer(
        Metrics("p"),
        health,
        port=0,
        host="0.0.0.0",
        drain=drain,
        drain_from=("198.51.100.7",),
        max_connections=3,
        idle_timeout=IDLE,
        header_deadline=DEADLINE,
    ).start()
    try:
        yield srv
    finally:
        srv.stop()


def test_a_slowloris_client_is_cut_off_while_others_are_answered(server: MetricsServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as slow:
        slow.sendall(b"GET /metrics HTTP/1.1\r\n")
        stop = threading.Event()

        def trickle() -> None:  # a header byte every 0.3 s: never idle, never complete
            while not stop.wait(0.3):
                try:
                    slow.sendall(b"X")
                except OSError:
                    return

        threading.Thread(target=trickle, daemon=True).start()
        try:
            assert get(server.port, "/healthz")[0] == 200  # served meanwhile
            took = closed_within(slow, DEADLINE + 3)
        finally:
            stop.set()
    assert took < DEADLINE + 1.5


def test_an_idle_connection_is_closed_after_the_timeout(server: MetricsServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as idle:
        assert get(server.port, "/readyz")[0] == 200
        assert closed_within(idle, IDLE + 3) < IDLE + 1.5


def slots_taken(port: int, within: float = 10.0) -> bytes:
    """Wait until a new connection to ``port`` is refused with 503 (its slots are all held)."""
    deadline = time.monotonic() + within
    while True:
        answer = raw(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        if answer.startswith(b"HTTP/1.1 503") or time.monotonic() > deadline:
            return answer
        time.sleep(0.05)


def test_connections_past_the_cap_get_503_and_a_slot_frees(server: MetricsServer) -> None:
    holders = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
    try:
        answer = slots_taken(server.port)  # accepted, each in its handler thread
        assert answer.startswith(b"HTTP/1.1 503"), answer
    finally:
        for h in holders:
            h.close()
    deadline = time.monotonic() + 10  # the handlers see EOF and give their slots back
    while get(server.port, "/healthz")[0] != 200:
        assert time.monotonic() < deadline, "no slot came back after the holders left"
        time.sleep(0.05)


def test_probes_are_answered_while_slow_clients_hold_every_metrics_slot() -> None:
    """The flood that took 25 of 25 probes (issue 38): 16 slow clients on the metrics port.
    The probe listener has slots of its own: every probe answered, each within a second."""
    health = Health(max_poll_interval_s=60)
    health.set_ready(True)
    metrics = Metrics("p")
    with (
        MetricsServer(metrics, health, port=0, host="127.0.0.1") as served,
        MetricsServer(metrics, health, port=0, host="127.0.0.1", probes_only=True) as probes,
    ):
        holders = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(16)]
        try:
            for h in holders:  # slowloris: a request that never completes
                h.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
            answer = slots_taken(served.port)
            assert answer.startswith(b"HTTP/1.1 503"), answer  # the flood holds the slots
            answered = []
            for i in range(25):
                began = time.monotonic()
                status, _ = get(probes.port, "/healthz" if i % 2 else "/readyz")
                answered.append((status, time.monotonic() - began))
            assert [s for s, _ in answered] == [200] * 25, answered
            assert max(t for _, t in answered) < 1.0, answered
            # Still flooded when the last probe was answered.
            assert slots_taken(served.port, within=0).startswith(b"HTTP/1.1 503")
        finally:
            for h in holders:
                h.close()


def test_the_probe_listener_serves_probes_only() -> None:
    health = Health(max_poll_interval_s=60)
    with MetricsServer(Metrics("p"), health, port=0, host="127.0.0.1", probes_only=True) as srv:
        assert get(srv.port, "/healthz")[0] == 200
        assert get(srv.port, "/readyz")[0] == 503  # not ready yet, as on the metrics port
        for path in ("/metrics", "/drain", "/"):
            status, body = get(srv.port, path)
            assert status == 404 and "serves /healthz and /readyz" in body, (path, body)
    with pytest.raises(ValueError, match="does not serve /drain"):
        MetricsServer(Metrics("q"), health, port=0, probes_only=True, drain=lambda: (True, ""))


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /" + b"a" * 4000 + b" HTTP/1.1\r\n\r\n", b"414"),
        (b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: " + b"p" * 9000 + b"\r\n\r\n", b"431"),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", b"413"),
        (b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", b"413"),
    ],
    ids=["long-request-line", "big-headers", "body", "chunked-body"],
)
def test_oversized_requests_are_refused(
    server: MetricsServer, request_bytes: bytes, status: bytes
) -> None:
    answer = raw(server.port, request_bytes)
    assert answer.split(b" ", 2)[1] == status, answer[:200]
    assert get(server.port, "/healthz")[0] == 200  # and the server is fine


def test_drain_only_from_loopback_or_the_node(server: MetricsServer, drained: list[str]) -> None:
    outside = outside_address()
    assert get(server.port, "/readyz", outside)[0] == 200  # probes from anywhere
    status, body = get(server.port, "/drain", outside)
    assert status == 403 and f"not {outside}" in body
    assert drained == []  # nothing happened
    assert get(server.port, "/drain")[0] == 200
    assert drained == ["drained"]


def test_drain_from_the_node_address_is_served(drained: list[str]) -> None:
    outside = outside_address()  # this host standing in for the pod's node

    def drain() -> tuple[bool, str]:
        drained.append("drained")
        return True, "drained"

    srv = MetricsServer(
        Metrics("p"), Health(60), port=0, drain=drain, drain_from=(outside,)
    ).start()
    try:
        assert get(srv.port, "/drain", outside)[0] == 200
    finally:
        srv.stop()
    assert drained == ["drained"]


def test_no_drain_unless_the_worker_serves_it() -> None:
    srv = MetricsServer(Metrics("p"), Health(60), port=0, host="127.0.0.1").start()
    try:
        assert get(srv.port, "/drain")[0] == 404
    finally:
        srv.stop()
