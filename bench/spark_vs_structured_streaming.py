"""Kafka to Parquet: the Offtake worker's Spark sink against Spark Structured Streaming.

    python bench/spark_vs_structured_streaming.py [--records 200000] [--batch 50000]

Same broker, same topic, same JVM, same run. The anchor is what a Spark user would write: a
Structured Streaming query reading the topic with spark-sql-kafka (from Maven Central),
parsing the JSON value and writing Parquet with ``Trigger.AvailableNow``. The worker runs the
real engine with ``sink.spark`` (parquet), timed until its committed offsets reach the log end
(that is, every batch written and committed). Both outputs are counted, so a fast wrong answer
shows. Also reported: the JVM's start time and the job time of a 10,000-record batch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from offtake.config import parse_pipeline
from offtake.engine.worker import Worker
from offtake.metrics import Metrics
from offtake.records import Record
from offtake.sinks.base import SinkItem
from offtake.sinks.spark import SparkSink
from offtake.sinks.spark.session import create_session, session_config
from offtake_testbed.kafka import KafkaBroker

PARTITIONS = 4


def fill(bootstrap: str, topic: str, records: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(records):
        value = {"id": i, "customer": f"c{i % 97}", "amount": i * 0.5, "pad": "x" * 100}
        producer.produce(topic, json.dumps(value).encode(), key=str(i).encode())
        if i % 20_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def pipeline_doc(bootstrap: str, topic: str, path: str, batch: int) -> dict[str, Any]:
    return {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": "bench-spark"},
        "spec": {
            "kafka": {"bootstrapServers": bootstrap},
            "source": {"topics": [topic], "groupId": f"bench-{uuid.uuid4().hex}"},
            "sink": {
                "spark": {
                    "format": "parquet",
                    "path": path,
                    "batch": {"maxRecords": batch, "maxIntervalSeconds": 2},
                }
            },
            "limits": {"maxInFlightMessages": batch * PARTITIONS * 2, "maxInFlightBytes": 1 << 30},
        },
    }


def start_session(kafka_package: str) -> tuple[Any, float]:
    doc = pipeline_doc("unused:9092", "t", "/unused", 1000)
    spec = parse_pipeline(doc).sink.spark
    assert spec is not None
    cfg = session_config(spec, "bench")
    cfg = type(cfg)(
        **{
            **cfg.__dict__,
            "packages": (*cfg.packages, kafka_package),
            "conf": {**cfg.conf, "spark.sql.shuffle.partitions": "4"},
        }
    )
    began = time.monotonic()
    session = create_session(cfg)
    return session, time.monotonic() - began


def batch_job_seconds(session: Any, path: str, rounds: int = 5) -> list[float]:
    """Job time of one 10,000-record batch, driving the sink directly."""
    spec = parse_pipeline(pipeline_doc("unused:9092", "t", path, 10_000))
    metrics = Metrics("bench")
    sink = SparkSink(spec, metrics, session=session)
    done: list[int] = []
    sink.start(lambda item, err: done.append(1))
    times: list[float] = []
    for r in range(rounds):
        for o in range(r * 10_000, (r + 1) * 10_000):
            v = {"id": o, "customer": f"c{o % 97}", "amount": o * 0.5, "pad": "x" * 100}
            rec = Record("t", 0, o, str(o).encode(), v, (), 1_700_000_000_000 + o, b"")
            sink.submit(SinkItem(rec, [v]))
        began = time.monotonic()
        assert sink.drain(None, 300)
        times.append(time.monotonic() - began)
    sink.close()
    return times


def worker_run(session: Any, bootstrap: str, topic: str, path: str, batch: int) -> float:
    spec = parse_pipeline(pipeline_doc(bootstrap, topic, path, batch))
    metrics = Metrics("bench")
    worker = Worker(spec, sink=SparkSink(spec, metrics, session=session), metrics=metrics)
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe"})
    ends = sum(
        probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
        for p in range(PARTITIONS)
    )
    probe.close()
    began = time.monotonic()
    runner = threading.Thread(target=worker.run)
    runner.start()
    while True:
        committed = sum(
            worker.tracker.last_committed(tp) or 0 for tp in worker.tracker.partitions()
        )
        if committed >= ends:
            break
        if not runner.is_alive():
            raise RuntimeError("the worker stopped before reaching the log end")
        time.sleep(0.05)
    elapsed = time.monotonic() - began
    worker.stop()
    runner.join()
    return elapsed


def structured_streaming_run(session: Any, bootstrap: str, topic: str, path: str) -> float:
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    schema = StructType(
        [
            StructField("id", LongType()),
            StructField("customer", StringType()),
            StructField("amount", DoubleType()),
            StructField("pad", StringType()),
        ]
    )
    began = time.monotonic()
    src = (
        session.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    rows = src.select(
        "topic",
        "partition",
        "offset",
        "timestamp",
        "key",
        F.from_json(F.col("value").cast("string"), schema).alias("v"),
    ).select("topic", "partition", "offset", "timestamp", "key", "v.*")
    query = (
        rows.writeStream.format("parquet")
        .option("path", path)
        .option("checkpointLocation", path + "_checkpoint")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=50_000)
    # Spark 4.3.0 has no spark-sql-kafka on Maven Central yet (and 4.2.0 lacks its token
    # provider there): pass a version that resolves and runs on the installed Spark.
    parser.add_argument(
        "--kafka-package", default="org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0"
    )
    args = parser.parse_args()
    kafka_package = args.kafka_package
    work = tempfile.mkdtemp(prefix="offtake-bench-spark-")
    try:
        with KafkaBroker() as broker:
            topic = "bench-spark"
            broker.create_topic(topic, PARTITIONS)
            fill(broker.bootstrap, topic, args.records)
            session, jvm_seconds = start_session(kafka_package)
            print(f"JVM + session start: {jvm_seconds:.1f}s", flush=True)
            jobs = batch_job_seconds(session, os.path.join(work, "jobs"))
            print(f"10k-record batch job: {[round(j, 2) for j in jobs]} s", flush=True)
            w_path, s_path = os.path.join(work, "offtake"), os.path.join(work, "sss")
            w = worker_run(session, broker.bootstrap, topic, w_path, args.batch)
            w_rows = session.read.parquet(w_path).count()
            print(f"offtake worker: {args.records / w:,.0f} rows/s ({w:.1f}s)", flush=True)
            s: float | None = None
            s_rows: int | None = None
            s_error = None
            try:
                s = structured_streaming_run(session, broker.bootstrap, topic, s_path)
                s_rows = session.read.parquet(s_path).count()
                print(f"structured streaming: {args.records / s:,.0f} rows/s ({s:.1f}s)")
            except Exception as exc:  # a connector built for another Spark version
                s_error = str(exc).splitlines()[0][:300]
                print(f"structured streaming failed: {s_error}", flush=True)
            session.stop()
        print(
            json.dumps(
                {
                    "records": args.records,
                    "partitions": PARTITIONS,
                    "batch_max_records": args.batch,
                    "cpus": os.cpu_count(),
                    "jvm_start_seconds": round(jvm_seconds, 2),
                    "batch_10k_job_seconds_median": round(statistics.median(jobs[1:] or jobs), 3),
                    "batch_10k_rows_per_second": round(
                        10_000 / statistics.median(jobs[1:] or jobs)
                    ),
                    "offtake_rows_per_second": round(args.records / w),
                    "structured_streaming_rows_per_second": round(args.records / s),
                    "ratio_offtake_vs_structured_streaming": round(s / w, 2),
                    "rows_written": {"offtake": w_rows, "structured_streaming": s_rows},
                },
                indent=2,
            )
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
