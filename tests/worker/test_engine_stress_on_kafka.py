"""The batch-first hot path under load: multi-value items, two threads, per-record failures.

The Kafka sink accounts for a batch with one counter that every delivery report draws from;
whichever thread polls the producer, each item must complete once, and only once, when all of
its values are written. The worker moves one poll's records of a partition as one unit; a
record that fails inside it must fail alone (dead-lettered), its neighbours delivered.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from support.workers import manifest, produce, read_all, running, wait_committed

from offtake.config import parse_pipeline
from offtake.engine.assembly import build_worker
from offtake.records import Record
from offtake.sinks.base import SinkBatch, SinkItem
from offtake.sinks.kafka import KafkaSink
from offtake_testbed.kafka import KafkaBroker


def test_kafka_sink_settles_each_multi_value_item_once_with_two_threads_polling(
    kafka_broker: KafkaBroker, topic_factory: Any
) -> None:
    out = topic_factory(4)
    producer = Producer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "linger.ms": 5,
            "enable.idempotence": True,
            "acks": "all",
            "queue.buffering.max.messages": 2_000,  # small: submits wait on a full queue too
        }
    )
    sink = KafkaSink(producer, out)
    settlements: Counter[tuple[int, int]] = Counter()
    failures: list[BaseException] = []
    lock = threading.Lock()

    def settled(batch: SinkBatch, failed: Mapping[int, BaseException]) -> None:
        with lock:
            for item in batch.items:
                settlements[item.record.partition, item.record.offset] += 1
            failures.extend(failed.values())

    sink.start(settled)
    items = [
        SinkItem(
            Record("src", p, o, str(o).encode(), None, (), None),
            [json.dumps({"p": p, "o": o, "v": k}).encode() for k in range(o % 5)],  # 0..4
            epoch=1,
        )
        for o in range(2_500)
        for p in range(4)
    ]
    stop = threading.Event()
    errors: list[BaseException] = []

    def processing() -> None:  # submits in batches of one partition, like the engine
        try:
            for start in range(0, len(items), 400):
                for p in range(4):
                    mine = [it for it in items[start : start + 400] if it.tp[1] == p]
                    sink.submit(SinkBatch.of(mine))
                sink.poll()
        except BaseException as exc:
            errors.append(exc)
        finally:
            stop.set()

    thread = threading.Thread(target=processing, name="offtake-processing")
    thread.start()
    while not stop.is_set():  # a second thread polls the same producer meanwhile
        sink.poll()
        time.sleep(0.001)
    thread.join()
    deadline = time.monotonic() + 60
    while len(settlements) < len(items) and time.monotonic() < deadline:
        sink.drain(None, 0.5)
    assert errors == [] and failures == []
    doubled = {k: n for k, n in settlements.items() if n != 1}
    assert doubled == {}, f"{len(doubled)} item(s) settled more than once"
    assert len(settlements) == len(items), f"{len(items) - len(settlements)} never settled"
    written = Counter(
        (v["p"], v["o"])
        for v in (json.loads(m.value()) for m in read_all(kafka_broker.bootstrap, out))
    )
    assert written == Counter(
        {(it.record.partition, it.record.offset): len(it.values) for it in items if it.values}
    )


@pytest.mark.parametrize("batch", [False, True], ids=["per-record", "batch-function"])
def test_worker_fans_out_and_dead_letters_inside_batches_without_loss_or_doubles(
    batch: bool, kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src, out, dlq = topic_factory(4), topic_factory(4), topic_factory(1)
    total = 20_000
    poison = set(range(7, total, 97))
    doc = manifest(
        "stress",
        kafka_broker.bootstrap,
        [src],
        sink={"kafka": {"topic": out}},
        processor={"function": "support.processors:fan_out_batch", "batch": True}
        if batch
        else {"function": "support.processors:fan_out"},
        errors={"maxRetries": 0, "policy": "dlq", "dlq": {"topic": dlq}},
    )
    doc["spec"]["source"]["format"] = "json"
    produce(
        kafka_broker.bootstrap,
        src,
        ({"id": i, "poison": i in poison} for i in range(total)),
    )
    worker = build_worker(parse_pipeline(doc))
    group = doc["spec"]["source"]["groupId"]
    with running(worker) as runner:
        wait_committed(runner, kafka_broker.bootstrap, group, src, 4, total, timeout=180)
    parts = Counter(
        (v["id"], v["part"])
        for v in (json.loads(m.value()) for m in read_all(kafka_broker.bootstrap, out))
    )
    expected = Counter(
        {(i, k): 1 for i in range(total) if i not in poison for k in range(i % 4 + 1)}
    )
    assert parts == expected  # every value of every good record, once: nothing lost or doubled
    dead = Counter(json.loads(m.value())["id"] for m in read_all(kafka_broker.bootstrap, dlq))
    assert dead == Counter(poison)  # the poison records alone, once each
    processed = {
        s.labels["outcome"]: s.value
        for metric in worker.metrics.registry.collect()
        if metric.name == "offtake_messages_processed"
        for s in metric.samples
        if s.name.endswith("_total")
    }
    assert processed.get("delivered") == total - len(poison), processed
    assert processed.get("dlq") == len(poison), processed


def test_parallelism_runs_the_function_in_processes_and_keeps_partition_order(
    kafka_broker: KafkaBroker, topic_factory: Any
) -> None:
    src, out = topic_factory(2), topic_factory(1)
    total = 3_000
    doc = manifest(
        "parallel",
        kafka_broker.bootstrap,
        [src],
        sink={"kafka": {"topic": out}},
        processor={"function": "support.processors:with_pid", "parallelism": 2},
    )
    doc["spec"]["source"]["format"] = "json"
    produce(kafka_broker.bootstrap, src, ({"id": i} for i in range(total)))
    worker = build_worker(parse_pipeline(doc))
    group = doc["spec"]["source"]["groupId"]
    with running(worker) as runner:
        wait_committed(runner, kafka_broker.bootstrap, group, src, 2, total, timeout=120)
    values = [json.loads(m.value()) for m in read_all(kafka_broker.bootstrap, out)]
    assert sorted(v["id"] for v in values) == list(range(total))
    pids = {v["pid"] for v in values}
    # In the pool's processes, not this one. Which of the two takes a slice is the pool's
    # choice (a busy machine can hand both slices of every batch to the first one idle).
    assert pids and len(pids) <= 2 and os.getpid() not in pids
    source = [
        (m.partition(), json.loads(m.value())["id"]) for m in read_all(kafka_broker.bootstrap, src)
    ]
    written = [v["id"] for v in values]
    for p in (0, 1):  # each partition's records written in offset order
        ids = [i for q, i in source if q == p]
        mine = set(ids)
        assert [i for i in written if i in mine] == ids
