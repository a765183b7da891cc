"""A real Offtake worker (engine, Kafka consumer and sink) in this process, for metrics tests.

``RealWorker`` runs ``offtake.engine.worker.Worker`` in a thread with its own Metrics, Health
and MetricsServer on a free port, like ``offtake worker`` does in a pod; it satisfies the
``MetricsTarget`` protocol of conftest.py. The helpers read the broker's ground truth
(log-end and committed offsets) through the admin API.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterable
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from offtake.config.loader import parse_pipeline
from offtake.engine.assembly import build_worker
from offtake.health import Health, MetricsServer
from offtake.metrics import Metrics
from offtake.processing.function import FunctionProcessor
from offtake.records import Record


class SlowProcessor:
    """Takes ``seconds`` per record and fails on records marked poison (they go to the DLQ).

    With a ``gate``, every record first waits until the test opens it: a backlog that lasts as
    long as the test needs, whatever the machine's load, instead of one sized in seconds."""

    def __init__(self, seconds: float, gate: threading.Event | None = None) -> None:
        self.seconds = seconds
        self.gate = gate

    def __call__(self, record: Record) -> Any:
        if self.gate is not None:
            self.gate.wait(timeout=600)
        if self.seconds:
            time.sleep(self.seconds)
        if isinstance(record.value, dict) and record.value.get("poison"):
            raise ValueError(f"poison record {record.where()}")
        return record.value


class RealWorker:
    def __init__(
        self,
        bootstrap: str,
        topics: list[str],
        *,
        seconds_per_record: float,
        sink_topic: str,
        dlq_topic: str | None = None,
        commit_interval: float = 1.0,
        max_in_flight: int = 10_000,
        name: str = "orders-enrich",
        gate: threading.Event | None = None,
    ) -> None:
        self.group = f"obs-{uuid.uuid4().hex[:8]}"
        errors: dict[str, Any] = {"policy": "skip", "maxRetries": 1, "retryBackoffSeconds": 0.01}
        if dlq_topic:
            errors = {**errors, "policy": "dlq", "dlq": {"topic": dlq_topic}}
        self.spec = parse_pipeline(
            {
                "apiVersion": "offtake.dev/v1alpha1",
                "kind": "ConsumerPipeline",
                "metadata": {"name": name, "namespace": "obs-test"},
                "spec": {
                    "kafka": {
                        "bootstrapServers": bootstrap,
                        "config": {"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"},
                    },
                    "source": {"topics": topics, "groupId": self.group, "startFrom": "earliest"},
                    "sink": {"kafka": {"topic": sink_topic}},
                    "commit": {"intervalSeconds": commit_interval},
                    "limits": {"maxInFlightMessages": max_in_flight},
                    "errors": errors,
                    "shutdown": {"drainTimeoutSeconds": 10},
                },
            }
        )
        self.metrics = Metrics(name)
        self.metrics.init_topics(topics)
        self.health = Health(max_poll_interval_s=300)
        self.server = MetricsServer(self.metrics, self.health, port=0, host="127.0.0.1")
        self.worker = build_worker(
            self.spec,
            processor=FunctionProcessor(SlowProcessor(seconds_per_record, gate)),
            metrics=self.metrics,
            health=self.health,
        )
        self._thread = threading.Thread(target=self._run, name="real-worker", daemon=True)
        self.exit_code: int | None = None
        self.failure: BaseException | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def _run(self) -> None:
        try:
            self.exit_code = self.worker.run()
        except BaseException as exc:  # surfaced by stop() and the tests
            self.failure = exc

    def start(self) -> RealWorker:
        self.server.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self.worker.stop("test finished")
        self._thread.join(timeout=60)
        self.server.stop()
        if self.failure is not None:
            raise AssertionError(f"the worker failed: {self.failure!r}") from self.failure

    def scrape(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """Samples of /metrics by name, as Prometheus would read them."""
        with urllib.request.urlopen(f"http://{self.target}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
        return out

    def exported_lag(self, topic: str) -> tuple[dict[int, float], dict[int, float]]:
        """(lag in messages, lag in seconds) per partition of ``topic``, from /metrics."""
        s = self.scrape()
        msgs = {
            int(lb["partition"]): v
            for lb, v in s.get("offtake_consumer_lag_messages", [])
            if lb["topic"] == topic
        }
        secs = {
            int(lb["partition"]): v
            for lb, v in s.get("offtake_consumer_lag_seconds", [])
            if lb["topic"] == topic
        }
        return msgs, secs


def admin_client(bootstrap: str) -> AdminClient:
    """An AdminClient without a Python logger (see ground_truth_lag)."""
    return AdminClient({"bootstrap.servers": bootstrap})


def produce(
    bootstrap: str, topic: str, ids: Iterable[int], poison_every: int = 0, partitions: int = 1
) -> int:
    """Produce JSON records {"id": i}, round-robin over partitions; every Nth is poison."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    n = 0
    for i in ids:
        value = {"id": i, "poison": bool(poison_every and i % poison_every == 0)}
        p.produce(topic, json.dumps(value).encode(), key=str(i).encode(), partition=i % partitions)
        n += 1
        if n % 5000 == 0:
            p.poll(0)
    assert p.flush(30) == 0, "the test producer could not deliver"
    return n


def ground_truth_lag(
    admin: AdminClient, bootstrap: str, group: str, topic: str, partitions: int
) -> dict[int, int]:
    """Log-end offset minus the group's committed offset, per partition, from the broker."""
    from confluent_kafka import Consumer

    req = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])
    res = admin.list_consumer_group_offsets([req])[group].result()
    committed = {tp.partition: tp.offset for tp in res.topic_partitions}
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{group}-watermarks"})
    try:
        ends = {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        c.close()
    return {p: ends[p] - max(committed.get(p, 0), 0) for p in range(partitions)}
