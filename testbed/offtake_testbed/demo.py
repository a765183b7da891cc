"""The embedded default, end to end: a local Kafka, sample orders, examples/kafka-to-kafka.yaml.

``python -m offtake_testbed.demo`` starts a broker from the cached Maven Central jars,
produces sample order events (a few of them malformed), runs ``offtake worker`` on the example
pipeline exactly as a pod would, waits until the group has committed everything, stops the
worker with SIGTERM and prints what happened.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from offtake.config import parse_pipeline
from offtake_testbed.kafka import KafkaBroker, install_kafka, read_topic
from offtake_testbed.process import free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "kafka-to-kafka.yaml"
PARTITIONS = 6


def sample_orders(count: int, seed: int = 7) -> list[bytes]:
    """Orders as JSON, with test orders (dropped) and one malformed record in 2,000 (DLQ)."""
    rnd = random.Random(seed)
    out: list[bytes] = []
    for i in range(count):
        if i % 2000 == 1999:
            out.append(b'{"id": %d, "amount": ' % i)  # truncated JSON: cannot be decoded
            continue
        order = {
            "id": i,
            "amount": round(rnd.uniform(5, 500), 2),
            "country": rnd.choice(["DE", "FR", "NL", "US"]),
            "status": "test" if i % 100 == 0 else "new",
        }
        out.append(json.dumps(order).encode())
    return out


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 10})
    for i, value in enumerate(values):
        producer.produce(topic, value, key=str(i).encode())
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(30):
        raise SystemExit("demo: could not produce the sample events")


def group_lag(bootstrap: str, group: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        done = {tp.partition: tp.offset for tp in c.committed(parts, timeout=10)}
        ends = {p.partition: c.get_watermark_offsets(p, timeout=10)[1] for p in parts}
        return sum(ends[p] - max(done.get(p, 0), 0) for p in ends)
    finally:
        c.close()


def scrape(port: int) -> dict[str, float]:
    """The worker's counters, summed over labels; processed is split by outcome."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name
            if "outcome" in sample.labels:
                key = f"{key}[{sample.labels['outcome']}]"
            if "result" in sample.labels:
                key = f"{key}[{sample.labels['result']}]"
            totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def run(count: int) -> int:
    install_kafka()
    with KafkaBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
        spec = doc["spec"]
        spec["kafka"]["bootstrapServers"] = broker.bootstrap
        source, sink, dlq = (
            spec["source"]["topics"][0],
            spec["sink"]["kafka"]["topic"],
            spec["errors"]["dlq"]["topic"],
        )
        for topic in (source, sink, dlq):
            broker.create_topic(topic, PARTITIONS)
        print(
            f"Kafka on {broker.bootstrap}; topics {source}, {sink}, {dlq} "
            f"({PARTITIONS} partitions each)"
        )
        started = time.monotonic()
        produce(broker.bootstrap, source, sample_orders(count))
        print(f"produced {count} sample orders to {source}")
        manifest = Path(tmp) / "pipeline.yaml"
        manifest.write_text(yaml.safe_dump(doc))
        port = free_port()
        # No PYTHONPATH: offtake_examples is installed (examples/pyproject.toml), as a user's
        # functions would be.
        env = {**os.environ, "OFFTAKE_LOG_LEVEL": "WARNING"}
        log_path = Path(tmp) / "worker.log"
        with log_path.open("wb") as log:
            worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "offtake.cli",
                    "worker",
                    "--pipeline",
                    str(manifest),
                    "--metrics-port",
                    str(port),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
            print(
                f"running: offtake worker --pipeline {EXAMPLE.relative_to(REPO)} "
                f"(metrics on :{port})"
            )
            # The loader's group id: the manifest's, or its default (<namespace>.<name>).
            group = parse_pipeline(doc).source.group_id
            deadline = time.monotonic() + 300
            while (lag := group_lag(broker.bootstrap, group, source)) > 0:
                if worker.poll() is not None or time.monotonic() > deadline:
                    print(log_path.read_text()[-3000:], file=sys.stderr)
                    print(f"demo: the worker did not catch up (lag {lag})", file=sys.stderr)
                    return 1
                time.sleep(0.5)
            elapsed = time.monotonic() - started
            metrics = scrape(port)
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(60)
        out, dead = len(read_topic(broker.bootstrap, sink)), len(read_topic(broker.bootstrap, dlq))
        print("\nsummary")
        print(f"  records consumed      {metrics.get('offtake_messages_consumed_total', 0):.0f}")
        for outcome in ("delivered", "dropped", "dlq", "skipped"):
            label = f"processed, {outcome}"
            print(
                f"  {label:<22}{metrics.get(f'offtake_messages_processed_total[{outcome}]', 0):.0f}"
            )
        print(f"  commits               {metrics.get('offtake_commits_total[success]', 0):.0f}")
        print(f"  lag after the run     {lag} records")
        print(f"  output                {out} records in topic {sink}")
        print(f"  dead letters          {dead} records in topic {dlq}")
        print(f"  time                  {elapsed:.1f}s from first produce to fully committed")
        print(f"  worker exit code      {code} (SIGTERM: drained, committed, left the group)")
        return 0 if code == 0 and lag == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m offtake_testbed.demo", description=__doc__)
    parser.add_argument("--records", type=int, default=20_000)
    return run(parser.parse_args(argv).records)


if __name__ == "__main__":
    sys.exit(main())
