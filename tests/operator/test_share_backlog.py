"""status.backlog of a queue-mode pipeline from its workers' /metrics (offtake_operator
.share_backlog): real worker Metrics served over HTTP on this host, the least backlog per
partition summed, and a worker that answers too much, garbage or nothing left out."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import generate_latest

from offtake.metrics import Metrics
from offtake_operator import share_backlog


@contextmanager
def serving(body: bytes) -> Iterator[int]:
    """An HTTP server on 127.0.0.1 answering /metrics with ``body``; yields its port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def pod(ip: str = "127.0.0.1", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "w"}, "status": {"phase": "Running", "podIP": ip, **status}}


def worker_text(backlog: dict[tuple[str, str], float]) -> bytes:
    m = Metrics("jobs")
    for (topic, partition), value in backlog.items():
        m.share_backlog.labels(topic, partition).set(value)
    m.lag_seconds.labels("jobs", "0").set(3.0)
    return generate_latest(m.registry)


def test_a_real_workers_metrics_parse_to_its_backlog() -> None:
    text = worker_text({("jobs", "0"): 500, ("jobs", "1"): 7}).decode()
    assert share_backlog.parse_backlog(text) == {("jobs", 0): 500.0, ("jobs", 1): 7.0}


def test_the_least_backlog_per_partition_summed_from_the_workers() -> None:
    behind = worker_text({("jobs", "0"): 700})  # acquired from p0 a while ago
    ahead = worker_text({("jobs", "0"): 450, ("jobs", "1"): 30})
    with serving(behind) as p1, serving(ahead) as p2:
        # Two workers on two ports stand in for two pod IPs on one metrics port.
        got = [asyncio.run(share_backlog.read_backlog([pod()], port)) for port in (p1, p2)]
    assert got == [{("jobs", 0): 700}, {("jobs", 0): 450, ("jobs", 1): 30}]
    assert share_backlog.group_backlog([{("jobs", 0): 700.0}, {("jobs", 0): 450.0}]) == {
        ("jobs", 0): 450
    }


def test_workers_that_do_not_answer_answer_too_much_or_garbage_leave_no_backlog() -> None:
    assert asyncio.run(share_backlog.read_backlog([], 9100)) is None
    # Not running, leaving, or no IP yet: not asked.
    leaving = pod()
    leaving["metadata"]["deletionTimestamp"] = "2026-11-28T00:00:00Z"
    assert share_backlog.worker_addresses([pod(phase="Pending"), leaving, pod(ip="")]) == []
    # Nothing listens there.
    with serving(b"") as port:
        pass
    assert asyncio.run(share_backlog.read_backlog([pod()], port)) is None
    garbage = b'offtake_share_backlog_messages{topic="a"} 5\n' + b"\xff" * 1000
    with serving(garbage) as port:
        assert asyncio.run(share_backlog.read_backlog([pod()], port)) is None
    # Past MAX_BYTES the rest is not read: a line after it does not count.
    huge = b"# " + b"x" * share_backlog.MAX_BYTES + b"\n" + worker_text({("jobs", "0"): 1})
    with serving(huge) as port:
        assert asyncio.run(share_backlog.read_backlog([pod()], port)) is None
