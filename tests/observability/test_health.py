"""Health and MetricsServer: probes over real HTTP on a free port."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CONTENT_TYPE_LATEST

from offtake.health import READY_STALL_SECONDS, Health, MetricsServer
from offtake.metrics import Metrics


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def get(port: int, path: str) -> tuple[int, str, str]:
    """(status, content type, body) of GET http://127.0.0.1:port/path."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


@pytest.fixture
def served() -> Iterator[tuple[Metrics, Health, MetricsServer]]:
    metrics, health = Metrics("p"), Health(max_poll_interval_s=0.5)
    server = MetricsServer(metrics, health, port=0, host="127.0.0.1").start()
    try:
        yield metrics, health, server
    finally:
        server.stop()


def test_liveness_follows_heartbeats_within_the_poll_budget() -> None:
    clock = FakeClock()
    health = Health(max_poll_interval_s=300, clock=clock)
    assert health.liveness()[0]  # start-up counts as a heartbeat
    clock.now += 299
    assert health.liveness()[0]
    clock.now += 2
    alive, reason = health.liveness()
    assert not alive
    assert "301.0s ago" in reason and "max.poll.interval.ms" in reason
    health.heartbeat()
    assert health.liveness()[0]


def test_readiness_is_false_until_set_and_carries_the_reason() -> None:
    health = Health(max_poll_interval_s=10)
    ready, reason = health.readiness()
    assert not ready and "assignment" in reason
    health.set_ready(True)
    assert health.readiness() == (True, "ready")
    health.set_ready(False, "shutting down")
    assert health.readiness() == (False, "shutting down")


def test_an_unavailable_processor_makes_a_ready_worker_not_ready_until_it_answers() -> None:
    health = Health(max_poll_interval_s=30)
    health.set_ready(True)
    health.set_processor_unavailable("processor unavailable: connection refused")
    assert health.readiness() == (False, "processor unavailable: connection refused")
    health.set_processor_unavailable(None)
    assert health.readiness() == (True, "ready")
    # Shutting down wins over a processor that answers again.
    health.set_processor_unavailable("processor unavailable: timed out")
    health.set_ready(False, "shutting down")
    health.set_processor_unavailable(None)
    assert health.readiness() == (False, "shutting down")


def test_health_rejects_a_non_positive_budget() -> None:
    with pytest.raises(ValueError, match="max_poll_interval_s"):
        Health(max_poll_interval_s=0)


def test_healthz_flips_to_503_when_heartbeats_stop() -> None:
    # Served over real HTTP; time is the health's own clock, moved by the test: how long the
    # heartbeats stopped is then what the test says, whatever the machine's load.
    clock = FakeClock()
    health = Health(max_poll_interval_s=0.5, clock=clock)
    server = MetricsServer(Metrics("p"), health, port=0, host="127.0.0.1").start()
    try:
        assert server.port > 0
        for _ in range(3):
            health.heartbeat()
            status, ctype, body = get(server.port, "/healthz")
            assert status == 200, body
            assert ctype == "application/json" and json.loads(body)["status"] == "ok"
            clock.now += 0.1
        clock.now += 0.7  # heartbeats stop for longer than the 0.5 s budget
        status, _, body = get(server.port, "/healthz")
        assert status == 503
        answer = json.loads(body)
        assert answer["status"] == "fail" and "poll loop stuck" in answer["reason"]
        health.heartbeat()
        assert get(server.port, "/healthz")[0] == 200
    finally:
        server.stop()


def test_readyz_follows_set_ready(served: tuple[Metrics, Health, MetricsServer]) -> None:
    _, health, server = served
    assert get(server.port, "/readyz")[0] == 503
    health.set_ready(True)
    assert get(server.port, "/readyz")[0] == 200
    health.set_ready(False, "shutting down")
    status, _, body = get(server.port, "/readyz")
    assert status == 503 and json.loads(body)["reason"] == "shutting down"


def test_metrics_endpoint_serves_the_registry_in_text_format(
    served: tuple[Metrics, Health, MetricsServer],
) -> None:
    metrics, _, server = served
    metrics.consumed.labels("orders").inc(42)
    status, ctype, body = get(server.port, "/metrics")
    assert status == 200 and ctype == CONTENT_TYPE_LATEST
    assert 'offtake_messages_consumed_total{topic="orders"} 42.0' in body
    assert get(server.port, "/metrics?x=1")[0] == 200
    assert get(server.port, "/nope")[0] == 404


def test_two_servers_in_one_process_keep_their_registries_apart() -> None:
    a, b = Metrics("a"), Metrics("b")
    a.consumed.labels("t").inc(1)
    b.consumed.labels("t").inc(2)
    with (
        MetricsServer(a, Health(10), 0, host="127.0.0.1") as sa,
        MetricsServer(b, Health(10), 0, host="127.0.0.1") as sb,
    ):
        assert 'offtake_messages_consumed_total{topic="t"} 1.0' in get(sa.port, "/metrics")[2]
        assert 'offtake_messages_consumed_total{topic="t"} 2.0' in get(sb.port, "/metrics")[2]


def test_stop_releases_the_port_and_a_busy_port_names_the_setting() -> None:
    server = MetricsServer(Metrics(), Health(10), 0, host="127.0.0.1").start()
    port = server.port
    with pytest.raises(OSError, match=r"spec\.metrics\.port"):
        MetricsServer(Metrics(), Health(10), port, host="127.0.0.1").start()
    server.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
    again = MetricsServer(Metrics(), Health(10), port, host="127.0.0.1").start()
    again.stop()


def test_readiness_turns_false_while_the_poll_loop_stalls_and_back_when_it_polls() -> None:
    now = [0.0]
    health = Health(max_poll_interval_s=300.0, clock=lambda: now[0])
    health.set_ready(True)
    now[0] = READY_STALL_SECONDS - 0.5
    assert health.readiness() == (True, "ready")
    now[0] = READY_STALL_SECONDS + 0.5
    ready, reason = health.readiness()
    assert not ready and reason.startswith("poll loop stalled: last poll 10.5s ago")
    assert health.liveness()[0]  # stalled, not dead: that takes max.poll.interval.ms
    health.heartbeat()
    assert health.readiness() == (True, "ready")
