"""Kafka-to-Kafka passthrough: the worker against a hand-written confluent-kafka loop.

    python bench/passthrough.py [--records 200000] [--rounds 2]

The anchor is the loop people write by hand: consume a poll batch, produce each record, flush
the producer, commit synchronously. It is measured in the same run, on the same broker and
data, and the worker's throughput is reported as a ratio against it (machine speed cancels
out). Both are timed from start until the group's committed offsets reach the log end, so
both pay the same group join.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from offtake.config import parse_pipeline
from offtake.engine.worker import Worker
from offtake.kafka.produce import produce_waiting
from offtake_testbed.kafka import KafkaBroker

PARTITIONS = 6


def fill(bootstrap: str, topic: str, records: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    payload = {"pad": "x" * 150}
    for i in range(records):
        value = json.dumps({"id": i, **payload}).encode()
        produce_waiting(producer, topic, value=value, key=str(i).encode())
    assert producer.flush(60) == 0


def hand_written_loop(bootstrap: str, src: str, out: str, records: int) -> float:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"anchor-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True, "acks": "all"}
    )
    started = time.monotonic()
    consumer.subscribe([src])
    seen = 0
    while seen < records:
        batch = [m for m in consumer.consume(500, 1.0) if m.error() is None]
        for m in batch:
            producer.produce(out, m.value(), key=m.key(), headers=m.headers())
        if batch:
            producer.flush()
            consumer.commit(asynchronous=False)
            seen += len(batch)
    elapsed = time.monotonic() - started
    consumer.close()
    return elapsed


def worker_run(bootstrap: str, src: str, out: str, records: int, fmt: str) -> float:
    group = f"worker-{uuid.uuid4().hex}"
    doc = {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": "bench"},
        "spec": {
            "kafka": {"bootstrapServers": bootstrap},
            "source": {"topics": [src], "groupId": group, "format": fmt},
            "sink": {"kafka": {"topic": out}},
        },
    }
    worker = Worker(parse_pipeline(doc))
    started = time.monotonic()
    runner = threading.Thread(target=worker.run)
    runner.start()
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    parts = [TopicPartition(src, p) for p in range(PARTITIONS)]
    ends = {p.partition: probe.get_watermark_offsets(p, timeout=10)[1] for p in parts}
    while True:
        # The worker's own tracker knows its commits the moment the broker acknowledges them.
        done = {
            tp.partition: worker.tracker.last_committed(tp) or 0
            for tp in worker.tracker.partitions()
        }
        if sum(done.values()) >= sum(ends.values()):
            break
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    worker.stop()
    runner.join()
    probe.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with KafkaBroker(extra_config={"num.io.threads": "4"}) as broker:
        src = "bench-src"
        broker.create_topic(src, PARTITIONS)
        fill(broker.bootstrap, src, args.records)
        results: dict[str, list[float]] = {"anchor": [], "worker-bytes": [], "worker-json": []}
        for r in range(args.rounds):
            for name in results:
                out = f"bench-out-{name}-{r}"
                broker.create_topic(out, PARTITIONS)
                if name == "anchor":
                    seconds = hand_written_loop(broker.bootstrap, src, out, args.records)
                else:
                    seconds = worker_run(
                        broker.bootstrap, src, out, args.records, name.split("-")[1]
                    )
                results[name].append(args.records / seconds)
                print(
                    f"round {r}: {name:<13} {args.records / seconds:>10,.0f} records/s", flush=True
                )
        best = {name: max(values) for name, values in results.items()}
        summary = {
            "records": args.records,
            "rounds": args.rounds,
            "cpus": os.cpu_count(),
            "records_per_second": {k: round(v) for k, v in best.items()},
            "ratio_vs_anchor": {
                k: round(v / best["anchor"], 2) for k, v in best.items() if k != "anchor"
            },
        }
        print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
