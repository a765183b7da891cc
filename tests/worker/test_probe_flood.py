"""A real ``offtake worker`` on the real broker, its metrics port flooded by slow clients.

Issue 38: with the 16 connection slots of the metrics port held by clients that never finish a
request, 25 of 25 ``/healthz`` probes got 503, and at the chart's liveness settings the kubelet
restarts a healthy worker after a minute of it. The probes now go to the worker's probe
listener (``--probe-port``, which the operator passes from ``spec.metrics.probePort``): while a
flood of slow clients keeps every metrics slot taken, each of 25 probes is answered 200 within
a second, and the worker keeps consuming.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml
from confluent_kafka import Producer

from offtake.health import MAX_CONNECTIONS
from offtake_testbed.kafka import KafkaBroker, read_topic
from offtake_testbed.process import free_port
from offtake_testbed.pytest_plugin import TopicFactory


def call(port: int, path: str) -> tuple[int, float]:
    """(status, seconds) of one GET; status 0 when the connection itself failed."""
    began = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            status = int(answer.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError:
        status = 0
    return status, time.monotonic() - began


def refused(port: int) -> bool:
    """A new connection to ``port`` gets the server's 503 at once: its slots are all held."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return s.recv(12).startswith(b"HTTP/1.1 503")


class Flood:
    """Keeps ``size`` slowloris connections open on a port: each sends half a request and
    nothing more; one the server cuts off (its header deadline) is opened again at once."""

    def __init__(self, port: int, size: int) -> None:
        self.port, self.size = port, size
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
        return s

    def _run(self) -> None:
        held = [self._open() for _ in range(self.size)]
        try:
            while not self._stop.is_set():
                readable, _, _ = select.select(held, [], [], 0.1)
                for s in readable:  # closed by the server (or answered 503): take it again
                    s.close()
                    held[held.index(s)] = self._open()
        finally:
            for s in held:
                s.close()

    def __enter__(self) -> Flood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_probes_are_answered_while_the_metrics_port_is_flooded(
    kafka_broker: KafkaBroker, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    source, sink = topic_factory(), topic_factory()
    bootstrap = kafka_broker.bootstrap
    manifest = tmp_path / "pipeline.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "offtake.dev/v1alpha1",
                "kind": "ConsumerPipeline",
                "metadata": {"name": "flooded", "namespace": "t"},
                "spec": {
                    "kafka": {"bootstrapServers": bootstrap},
                    "source": {"topics": [source], "groupId": f"flood-{source}"},
                    "sink": {"kafka": {"topic": sink}},
                },
            }
        )
    )
    metrics_port, probe_port = free_port(), free_port()
    worker = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "offtake"),
            "worker", "--pipeline", str(manifest),
            "--metrics-port", str(metrics_port), "--probe-port", str(probe_port),
        ],
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while call(probe_port, "/readyz")[0] != 200:
            assert worker.poll() is None, worker.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the worker never became ready"
            time.sleep(0.2)
        with Flood(metrics_port, MAX_CONNECTIONS + 4):
            deadline = time.monotonic() + 30
            while not refused(metrics_port):  # every metrics slot held by the flood
                assert time.monotonic() < deadline, "the flood never took the metrics slots"
                time.sleep(0.1)
            probes = [call(probe_port, "/healthz" if i % 2 else "/readyz") for i in range(25)]
            assert refused(metrics_port)  # flooded throughout
            # And the worker consumes meanwhile.
            producer = Producer({"bootstrap.servers": bootstrap})
            for i in range(20):
                producer.produce(source, value=b'{"i": %d}' % i)
            assert producer.flush(30) == 0
            deadline = time.monotonic() + 60
            while len(read_topic(bootstrap, sink, timeout=30)) < 20:
                assert time.monotonic() < deadline, "the flooded worker did not deliver"
                time.sleep(0.5)
        assert [status for status, _ in probes] == [200] * 25, probes
        assert max(took for _, took in probes) < 1.0, probes
    finally:
        worker.terminate()
        worker.wait(30)
