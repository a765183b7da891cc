"""``offtake status`` on the real broker: per-partition committed offset, log end and lag."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from support.workers import manifest, produce, write_manifest

from offtake_testbed.kafka import KafkaBroker


def _commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        c.commit(offsets=tps, asynchronous=False)
    finally:
        c.close()


def produce_at(bootstrap: str, topic: str, count: int, when: float) -> None:
    """``count`` records ``{"id": n}`` stamped ``when`` (seconds since the epoch)."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        value = json.dumps({"id": i}).encode()
        producer.produce(topic, value, key=str(i).encode(), timestamp=int(when * 1000))
    assert producer.flush(30) == 0


def _status(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "offtake.cli", "status", "--pipeline", str(path), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_status_shows_each_partitions_committed_offset_and_lag(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    topic = topic_factory(2)
    # Written an hour ago, by their timestamps: their age, not a wait, is the lag in seconds.
    age = 3600.0
    produce_at(kafka_broker.bootstrap, topic, 40, time.time() - age)
    doc = manifest("status", kafka_broker.bootstrap, [topic], sink={"log": {}})
    group = doc["spec"]["source"]["groupId"]
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    ends = {}
    probe = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": group})
    for p in (0, 1):
        ends[p] = probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
    probe.close()
    assert sum(ends.values()) == 40
    _commit(kafka_broker.bootstrap, group, {(topic, 0): ends[0]})  # partition 0 caught up

    done = _status(path, "--once")

    assert done.returncode == 0, done.stderr
    rows = {
        int(cols[1]): cols
        for line in done.stdout.splitlines()
        if line.startswith(topic) and len(cols := line.split()) == 6
    }
    assert rows[0][2:5] == [str(ends[0]), str(ends[0]), "0"]
    assert rows[0][5] == "0.0"
    assert rows[1][2:5] == ["-", str(ends[1]), str(ends[1])]  # never committed: all of it lags
    assert age <= float(rows[1][5]) < age + 600  # the oldest uncommitted record's age
    assert "total" in done.stdout and done.stdout.split("total")[1].split()[0] == str(ends[1])


def test_status_names_a_topic_the_brokers_do_not_have(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    doc = manifest("status", kafka_broker.bootstrap, ["no-such-topic-here"], sink={"log": {}})
    done = _status(write_manifest(tmp_path / "pipeline.yaml", doc), "--once")
    assert done.returncode == 3
    assert "no-such-topic-here" in done.stderr and "Traceback" not in done.stderr


def test_status_of_a_share_group_shows_the_log_and_says_what_does_not_apply(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    topic = topic_factory(2)
    produce(kafka_broker.bootstrap, topic, ({"id": i} for i in range(10)))
    doc = manifest("status", kafka_broker.bootstrap, [topic], sink={"log": {}})
    doc["spec"]["source"]["groupType"] = "share"
    # A share consumer refuses session and heartbeat settings (queue mode's refusals).
    doc["spec"]["kafka"]["config"] = {}
    done = _status(write_manifest(tmp_path / "pipeline.yaml", doc), "--once")
    assert done.returncode == 0, done.stderr
    assert f"share group {doc['spec']['source']['groupId']}" in done.stdout
    assert "queue mode (share group): no committed offsets" in done.stdout
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith(topic)]
    assert sum(int(r[3]) for r in rows) == 10  # log end of each partition
