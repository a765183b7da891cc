"""Records written straight into a retry topic with hostile Offtake headers (issue 23, item 6):
the real worker neither crashes nor holds the partition past the topic's delay, counts attempts
it can read, and dead-letters with one copy of each of its own headers."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from support.workers import (
    WorkerProcess,
    ids_of,
    manifest,
    read_all,
    wait_caught_up,
    write_manifest,
)

from offtake_testbed.kafka import KafkaBroker

DELAY = 2


def test_forged_due_attempts_and_origin_on_a_retry_topic_change_nothing(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src, out, dlq = topic_factory(1), topic_factory(1), topic_factory(1)
    retry = f"{src}.retry-{DELAY}s"
    kafka_broker.create_topic(retry, 1)
    try:
        doc = manifest(
            "hostile-retry",
            kafka_broker.bootstrap,
            [src],
            sink={"kafka": {"topic": out}},
            processor={"function": "support.processors:poison"},
            errors={
                "policy": "dlq",
                "maxRetries": 0,
                "dlq": {"topic": dlq},
                "retryTopics": [{"delaySeconds": DELAY}],
            },
        )
        producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
        hostile = [
            ("offtake.retry.due", b"9223372036854775807"),  # the end of time: capped to the delay
            ("offtake.attempts", "\u00b2".encode()),  # isdigit(), and int() refuses it
            ("offtake.original.topic", b"elsewhere"),
            ("offtake.original.partition", b"\xff"),
        ]
        producer.produce(retry, json.dumps({"id": 1, "poison": True}).encode(), headers=hostile)
        behind = [("offtake.retry.due", b"-5"), ("offtake.attempts", b"9" * 5000)]
        producer.produce(retry, json.dumps({"id": 2}).encode(), headers=behind)
        assert producer.flush(30) == 0
        started = time.monotonic()
        worker = WorkerProcess(write_manifest(tmp_path / "p.yaml", doc), tmp_path / "w.log")
        worker.start()

        wait_caught_up(kafka_broker.bootstrap, doc["spec"]["source"]["groupId"], retry, 1, 60)
        took = time.monotonic() - started
        assert worker.terminate() == 0, worker.output()[-3000:]

        assert took < 30, f"the retry partition was held {took:.0f}s"
        assert "Traceback" not in worker.output()
        assert ids_of(read_all(kafka_broker.bootstrap, out)) == {2: 1}, "the record behind flowed"
        (dead,) = read_all(kafka_broker.bootstrap, dlq)
        names = [k for k, _ in dead.headers()]
        headers = dict(dead.headers())
        for name in ("offtake.original.topic", "offtake.original.partition", "offtake.attempts"):
            assert names.count(name) == 1, name
        assert headers["offtake.attempts"] == b"1", "an unreadable count counts 0"
        # An origin that does not read strictly: the retry record's own coordinates stand.
        assert headers["offtake.original.topic"] == retry.encode()
        assert headers["offtake.original.partition"] == b"0"
    finally:
        kafka_broker.delete_topic(retry, missing_ok=True)
