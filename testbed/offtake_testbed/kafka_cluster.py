"""Three real KRaft Kafka brokers as one cluster, for failover and chaos runs.

Each node is a combined broker+controller (``process.roles=broker,controller``) from the same
Maven Central jars as :class:`~offtake_testbed.kafka.KafkaBroker`, with a static three-voter
quorum, so the cluster keeps a controller majority with one node down. Topics get replication
factor 3 and ``min.insync.replicas=2`` by default: an ``acks=all`` write succeeds with one
broker down and is refused (not lost) with two down.

Unlike the single broker, a node keeps its folder and ports across :meth:`KafkaCluster.stop_node`
/ :meth:`kill_node` and :meth:`start_node`: a restarted broker rejoins with its log, the way a
pod with a persistent volume does, and clients find it at the address they knew.

    python -m offtake_testbed.kafka_cluster     # three brokers in the foreground until Ctrl-C
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from confluent_kafka import KafkaException

from .kafka.install import KAFKA_VERSION, KafkaTestbedError, install_kafka
from .kafka.jvm import (
    KafkaService,
    format_storage,
    launch_broker,
    log_tail,
    new_cluster_id,
    write_server_config,
)
from .maven import find_java
from .process import free_port, port_open

__all__ = ["KafkaCluster", "main"]

_log = logging.getLogger(__name__)
_WORKDIR_PREFIX = "offtake-kafka-cluster-"


class _Node:
    """One broker+controller JVM of the cluster; its folder and ports outlive its process."""

    def __init__(self, node_id: int, workdir: Path, port: int, controller_port: int) -> None:
        self.node_id = node_id
        self.workdir = workdir
        self.port = port
        self.controller_port = controller_port
        self.process: subprocess.Popen[bytes] | None = None

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.workdir, lines, f"node {self.node_id}")


class KafkaCluster(KafkaService):
    """Three KRaft brokers on 127.0.0.1 with per-node stop, kill and start."""

    def __init__(
        self,
        size: int = 3,
        *,
        version: str = KAFKA_VERSION,
        heap: str = "384m",
        min_insync_replicas: int = 2,
        start_timeout: float = 180.0,
        extra_config: Mapping[str, str] | None = None,
    ) -> None:
        if size < 1:
            raise KafkaTestbedError("a cluster needs at least one node")
        self.size = size
        self.replication_factor = size
        self.version = version
        self.heap = heap
        self.min_insync_replicas = min(min_insync_replicas, size)
        self.start_timeout = start_timeout
        self.extra_config = dict(extra_config or {})
        self._root: Path | None = None
        self._nodes: list[_Node] = []
        self._java = ""
        self._libs = Path()

    # -- public state -------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """Every node's address: clients find the cluster through any node that is up."""
        if not self._nodes:
            raise KafkaTestbedError("the Kafka cluster is not running; call start() first")
        return ",".join(f"127.0.0.1:{n.port}" for n in self._nodes)

    @property
    def node_ids(self) -> list[int]:
        return [n.node_id for n in self._nodes]

    def node_bootstrap(self, node_id: int) -> str:
        return f"127.0.0.1:{self._node(node_id).port}"

    def is_running(self, node_id: int | None = None) -> bool:
        """Whether ``node_id`` (or every node) has a live process."""
        nodes = [self._node(node_id)] if node_id is not None else self._nodes
        return bool(nodes) and all(n.is_running() for n in nodes)

    def node_pid(self, node_id: int) -> int:
        """The process id of a running node's JVM (to freeze it with SIGSTOP, say)."""
        node = self._node(node_id)
        if node.process is None or node.process.poll() is not None:
            raise KafkaTestbedError(f"node {node_id} is not running")
        return node.process.pid

    def leaders(self, topic: str) -> dict[int, int]:
        """partition -> node id of its current leader (-1 where none)."""
        md = self.admin().list_topics(topic, timeout=10)
        parts = md.topics[topic].partitions
        return {p: parts[p].leader for p in sorted(parts)}

    def in_sync(self, topic: str) -> dict[int, list[int]]:
        """partition -> node ids of its in-sync replicas."""
        md = self.admin().list_topics(topic, timeout=10)
        parts = md.topics[topic].partitions
        return {p: sorted(parts[p].isrs) for p in sorted(parts)}

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> KafkaCluster:
        """Format every node with one cluster id, launch all of them, wait for the quorum."""
        if self._nodes:
            raise KafkaTestbedError("the Kafka cluster is already running")
        self._java = find_java(KafkaTestbedError)
        self._libs = install_kafka(self.version)
        self._root = Path(tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-"))
        try:
            taken: set[int] = set()
            for node_id in range(1, self.size + 1):
                ports = []
                for _ in range(2):
                    port = free_port(taken)
                    taken.add(port)
                    ports.append(port)
                workdir = self._root / f"node-{node_id}"
                workdir.mkdir()
                self._nodes.append(_Node(node_id, workdir, ports[0], ports[1]))
            cluster_id = new_cluster_id()
            for node in self._nodes:
                write_server_config(node.workdir, self._properties(node))
                what = f"node {node.node_id}'s KRaft storage"
                format_storage(self._java, self._libs, node.workdir, cluster_id, what, [])
            for node in self._nodes:
                self._launch(node)
            atexit.register(self._kill_at_exit)
            self.wait_until_serving(self.start_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node (SIGTERM, SIGKILL after 20 s) and delete the cluster's folder."""
        atexit.unregister(self._kill_at_exit)
        self._admin = None
        for node in self._nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signal.SIGTERM)
        for node in self._nodes:
            self._reap(node, 20.0)
        self._nodes = []
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def stop_node(self, node_id: int, timeout: float = 30.0) -> None:
        """A controlled shutdown of one node (SIGTERM: leadership moves away first)."""
        node = self._node(node_id)
        if node.process is not None and node.process.poll() is None:
            node.process.send_signal(signal.SIGTERM)
        self._reap(node, timeout)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node: no controlled shutdown, the way a machine dies."""
        node = self._node(node_id)
        if node.process is not None and node.process.poll() is None:
            node.process.kill()
        self._reap(node, 10.0)

    def start_node(self, node_id: int) -> None:
        """Start a stopped or killed node again with its log and ports; returns once it listens."""
        node = self._node(node_id)
        if node.is_running():
            raise KafkaTestbedError(f"node {node_id} is already running")
        self._launch(node)
        deadline = time.monotonic() + self.start_timeout
        while not port_open(node.port):
            self._check_node(node)
            if time.monotonic() > deadline:
                raise KafkaTestbedError(f"node {node_id} did not listen again:\n{node.log_tail()}")
            time.sleep(0.1)

    def restart_all(self, grace: float = 10.0) -> None:
        """Every node down together (SIGTERM, SIGKILL after ``grace`` seconds: with every
        node leaving at once, controlled shutdown has nowhere to move leaders and retries),
        then up again: a full cluster restart. Call :meth:`wait_until_serving` after it."""
        for node in self._nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signal.SIGTERM)
        for node in self._nodes:
            self._reap(node, grace)
        self._admin = None
        for node in self._nodes:
            self._launch(node)

    def wait_until_serving(self, timeout: float = 120.0) -> None:
        """Wait until every running node is in the metadata and consumer groups work."""
        deadline = time.monotonic() + timeout
        want = {n.node_id for n in self._nodes if n.process is not None}
        last = ""
        while True:
            for node in self._nodes:
                self._check_node(node)
            try:
                md = self.admin().list_topics(timeout=2.0)
                if want <= set(md.brokers):
                    return
                last = f" (brokers in metadata: {sorted(md.brokers)})"
            except KafkaException as exc:
                last = f" (last error: {exc})"
            if time.monotonic() > deadline:
                raise KafkaTestbedError(
                    f"the cluster did not serve all of nodes {sorted(want)} within {timeout:g}s"
                    + last
                    + "\n"
                    + "\n".join(n.log_tail(10) for n in self._nodes)
                )
            time.sleep(0.2)

    # -- internals ----------------------------------------------------------------------------

    def _node(self, node_id: int) -> _Node:
        for node in self._nodes:
            if node.node_id == node_id:
                return node
        raise KafkaTestbedError(f"no node {node_id} (nodes: {self.node_ids})")

    def _properties(self, node: _Node) -> dict[str, str]:
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self._nodes)
        replicas = str(self.size)
        min_isr = str(self.min_insync_replicas)
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{node.port},"
            f"CONTROLLER://127.0.0.1:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.workdir / "data"),
            "num.partitions": "1",
            "default.replication.factor": replicas,
            "min.insync.replicas": min_isr,
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": "6",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": "6",
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
            "unclean.leader.election.enable": "false",
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "1000",
            # A dead follower leaves the ISR quickly, so acks=all writes go on with two nodes.
            "replica.lag.time.max.ms": "5000",
            "broker.session.timeout.ms": "6000",
            "broker.heartbeat.interval.ms": "1000",
            "log.segment.bytes": str(16 * 1024 * 1024),
            "log.retention.hours": "24",
            "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
            "num.network.threads": "2",
            "num.io.threads": "2",
            "num.replica.fetchers": "1",
        }
        props.update(self.extra_config)
        return props

    def _launch(self, node: _Node) -> None:
        node.process = launch_broker(
            self._java, self._libs, node.workdir, self.heap, initial_heap="96m"
        )

    def _reap(self, node: _Node, timeout: float) -> None:
        if node.process is None:
            return
        try:
            node.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _log.warning(
                "Kafka node %d ignored SIGTERM for %.0fs; killing it", node.node_id, timeout
            )
            node.process.kill()
            node.process.wait()
        node.process = None

    def _check_node(self, node: _Node) -> None:
        if node.process is not None and node.process.poll() is not None:
            code = node.process.returncode
            raise KafkaTestbedError(
                f"Kafka node {node.node_id} exited with code {code}:\n" + node.log_tail()
            )

    def _kill_at_exit(self) -> None:
        for node in self._nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.kill()
        self.stop()


def main(argv: list[str] | None = None) -> int:
    del argv
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    began = time.monotonic()
    try:
        with KafkaCluster() as cluster:
            print(f"3 Kafka brokers ready in {time.monotonic() - began:.1f}s", flush=True)
            print(f"bootstrap: {cluster.bootstrap}", flush=True)
            while cluster.is_running():
                time.sleep(0.5)
            print("a node exited unexpectedly", file=sys.stderr)
            return 1
    except KafkaTestbedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
