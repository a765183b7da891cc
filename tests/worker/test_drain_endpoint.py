"""``GET /drain`` of a real ``offtake worker`` process on the real broker: what an injected
worker's application container calls from its preStop hook (spec.mode: inject).

A slowloris client is cut off after the header deadline while probes are answered. Only the
pod itself may drain: a peer that is not on loopback (here this host's own
non-loopback address, as another pod of the cluster would be) gets 403 and the worker keeps
consuming; ``offtake drain`` (which calls 127.0.0.1) makes the worker stop consuming, deliver
and commit what it took, leave the group, and only then answer; it then stays (a native
sidecar that exited would be restarted) until SIGTERM, which ends it at once with exit code 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml
from confluent_kafka import Consumer, ConsumerGroupState, Producer, TopicPartition
from support.workers import group_state

from offtake.health import HEADER_DEADLINE_SECONDS
from offtake_testbed.kafka import KafkaBroker, read_topic
from offtake_testbed.process import free_port
from offtake_testbed.pytest_plugin import TopicFactory


def outside_address() -> str:
    """An address of this host that is not loopback: a peer connecting from it is seen as
    coming from the network, as another pod would be."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.250", 9))  # no packet is sent: only the route is looked up
        address = str(s.getsockname()[0])
    assert not address.startswith("127."), f"this host has no non-loopback address: {address}"
    return address


def call(port: int, path: str, host: str = "127.0.0.1", timeout: float = 60) -> tuple[int, str]:
    request = urllib.request.Request(f"http://{host}:{port}{path}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def produce(bootstrap: str, topic: str, first: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(first, first + count):
        producer.produce(topic, key=f"k{i}".encode(), value=json.dumps({"i": i}).encode())
    assert producer.flush(30) == 0


def delivered(worker: subprocess.Popen[str], bootstrap: str, topic: str, count: int) -> None:
    """Wait until ``topic`` holds ``count`` records while the worker runs."""
    deadline = time.monotonic() + 90
    while len(read_topic(bootstrap, topic, timeout=30)) < count:
        assert worker.poll() is None and time.monotonic() < deadline, f"not all {count} delivered"
        time.sleep(0.5)


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 10)
        return [tp.offset for tp in tps]
    finally:
        consumer.close()


def test_drain_delivers_commits_leaves_and_waits_for_sigterm(
    kafka_broker: KafkaBroker, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    source, sink = topic_factory(partitions=2), topic_factory()
    bootstrap = kafka_broker.bootstrap
    produce(bootstrap, source, 0, 300)
    group = f"drain-{source}"
    manifest = tmp_path / "pipeline.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "offtake.dev/v1alpha1",
                "kind": "ConsumerPipeline",
                "metadata": {"name": "drained", "namespace": "t"},
                "spec": {
                    "kafka": {"bootstrapServers": bootstrap},
                    "source": {"topics": [source], "groupId": group},
                    "sink": {"kafka": {"topic": sink}},
                    "commit": {"intervalSeconds": 60},  # only the drain's final commit counts
                },
            }
        )
    )
    port = free_port()
    script = Path(sys.executable).parent / "offtake"
    worker = subprocess.Popen(
        [str(script), "worker", "--pipeline", str(manifest), "--metrics-port", str(port)],
        # As injected: /drain on; the node's address is not this host's outside one.
        env={**os.environ, "OFFTAKE_DRAIN": "true", "OFFTAKE_NODE_IPS": "198.51.100.7"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        delivered(worker, bootstrap, sink, 300)
        # A slowloris client (a request that never finishes) holds no thread of the real
        # worker's server: others are answered meanwhile, and it is cut off after the deadline.
        with socket.create_connection(("127.0.0.1", port)) as slow:
            slow.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
            began = time.monotonic()
            assert call(port, "/readyz")[0] == 200
            slow.settimeout(30)
            with contextlib.suppress(ConnectionResetError):
                assert slow.recv(1) == b""
            assert time.monotonic() - began < HEADER_DEADLINE_SECONDS + 3
        outside = outside_address()
        # Probes and scrapes from the network are answered; a drain from there is not.
        assert call(port, "/readyz", outside)[0] == 200
        status, body = call(port, "/drain", outside)
        assert status == 403 and "only the pod itself may drain" in body, body
        # Still consuming: records written after the refused drain are delivered.
        produce(bootstrap, source, 300, 10)
        delivered(worker, bootstrap, sink, 310)
        assert call(port, "/readyz")[0] == 200

        drained = subprocess.run(
            [str(script), "drain", "--port", str(port), "--timeout", "60"],
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        assert drained.returncode == 0, drained.stderr
        assert json.loads(drained.stdout)["reason"] == "drained"
        # Answered only after the final commit: everything taken is committed.
        assert sum(committed(bootstrap, group, source, 2)) == 310
        assert call(port, "/readyz")[0] == 503
        # Out of the group (its coordinator has no member left) and consuming nothing more:
        # a worker that owns no partition cannot take what is written next.
        assert group_state(bootstrap, group) == ConsumerGroupState.EMPTY
        produce(bootstrap, source, 310, 50)
        assert worker.poll() is None  # yet still running
        assert len(read_topic(bootstrap, sink, timeout=30)) == 310
        began = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(15) == 0
        assert time.monotonic() - began < 10
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
