"""offtake.Backpressure: a processing function says "slow down"; its partition pauses alone.

The record is processed again after ``retry_after`` without counting a failure, the records
behind it on its partition wait in order, and the other partitions flow on meanwhile.
"""

from __future__ import annotations

import json
import time
from typing import Any

from support import processors
from support.workers import committed_records, manifest, produce, read_all, running

from offtake.config import parse_pipeline
from offtake.engine.assembly import build_worker
from offtake_testbed.kafka import KafkaBroker


def test_backpressure_from_the_function_pauses_its_partition_and_retries_without_failure(
    kafka_broker: KafkaBroker, topic_factory: Any
) -> None:
    src, out = topic_factory(2), topic_factory(1)
    doc = manifest(
        "slowdown",
        kafka_broker.bootstrap,
        [src],
        sink={"kafka": {"topic": out}},
        processor={"function": "support.processors:saturated"},
        errors={"maxRetries": 0, "policy": "stop"},  # a counted failure would stop the worker
    )
    doc["spec"]["source"]["format"] = "json"
    total = 400
    # Keys "0".."399" spread over both partitions; one record says its downstream is saturated.
    saturate = 100
    produce(
        kafka_broker.bootstrap,
        src,
        ({"id": i, "saturate": i == saturate} for i in range(total)),
    )
    processors.SLOW_DOWN_ATTEMPTS.clear()
    worker = build_worker(parse_pipeline(doc))
    group = doc["spec"]["source"]["groupId"]
    delayed_seen = 0.0
    with running(worker) as runner:
        deadline = time.monotonic() + 120
        while committed_records(kafka_broker.bootstrap, group, src, 2) < total:
            assert time.monotonic() < deadline, "not every record was committed"
            assert runner.is_alive(), "the worker stopped"
            delayed_seen = max(delayed_seen, worker.metrics.delayed_partitions._value.get())
            time.sleep(0.1)
    messages = read_all(kafka_broker.bootstrap, out)
    values = [json.loads(m.value()) for m in messages]
    assert sorted(v["id"] for v in values) == list(range(total))  # once each
    attempts = processors.SLOW_DOWN_ATTEMPTS[saturate]
    assert len(attempts) == 3  # two "slow down"s, then done: no attempt was charged
    assert attempts[1] - attempts[0] >= 0.9 and attempts[2] - attempts[1] >= 0.9
    assert delayed_seen >= 1, "the partition was not paused"
    # Its partition's records behind it waited, in offset order; the other partition did not.
    source = _source_partitions(kafka_broker.bootstrap, src)
    src_partition = {v["id"]: p for p, v in source}
    held = src_partition[saturate]
    done_at = {v["id"]: v["at"] for v in values}
    same = [v["id"] for v in values if src_partition[v["id"]] == held]
    # Written in offset order: those behind it were written only after it, once it went through
    # (those processed in the same call as it kept their results meanwhile).
    assert same == [v["id"] for p, v in source if p == held]
    others = [i for i in done_at if src_partition[i] != held]
    assert max(done_at[i] for i in others) < attempts[2], "the other partition was held too"
    errors = sum(
        s.value
        for metric in worker.metrics.registry.collect()
        if metric.name == "offtake_errors"
        for s in metric.samples
        if s.name.endswith("_total")
    )
    assert errors == 0


def _source_partitions(bootstrap: str, topic: str) -> list[tuple[int, dict[str, Any]]]:
    return [(m.partition(), json.loads(m.value())) for m in read_all(bootstrap, topic)]
