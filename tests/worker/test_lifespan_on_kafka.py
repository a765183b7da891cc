"""processor.lifespan on a real worker and broker: the session its calls share is opened once,
on the event loop the calls run on, before the first record, and closed once at the stop."""

from __future__ import annotations

import time
from typing import Any

from support import processors
from support.workers import committed_records, manifest, produce, read_all, running

from offtake.config import parse_pipeline
from offtake.engine.assembly import build_worker
from offtake_testbed.kafka import KafkaBroker


def test_the_lifespan_is_entered_once_and_exited_once_around_every_call(
    kafka_broker: KafkaBroker, topic_factory: Any
) -> None:
    src, out = topic_factory(3), topic_factory(1)
    doc = manifest(
        "lifespan",
        kafka_broker.bootstrap,
        [src],
        sink={"kafka": {"topic": out}},
        processor={
            "function": "support.processors:uses_session",
            "lifespan": "support.processors:async_session",
            "concurrency": 16,
        },
        errors={"maxRetries": 0, "policy": "stop"},  # a call without its session stops it
    )
    total = 300
    produce(kafka_broker.bootstrap, src, ({"id": i} for i in range(total)))
    processors.LIFESPAN_EVENTS.clear()
    worker = build_worker(parse_pipeline(doc))
    group = doc["spec"]["source"]["groupId"]
    with running(worker) as runner:
        deadline = time.monotonic() + 120
        while committed_records(kafka_broker.bootstrap, group, src, 3) < total:
            assert time.monotonic() < deadline, "not every record was committed"
            assert runner.is_alive(), "the worker stopped"
            time.sleep(0.1)
        assert processors.LIFESPAN_EVENTS == ["enter"]
    assert processors.LIFESPAN_EVENTS == ["enter", "exit"]  # at the stop, after the drain
    assert len(read_all(kafka_broker.bootstrap, out)) == total
