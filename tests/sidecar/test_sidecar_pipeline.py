"""Sidecar mode through the real engine (in-memory broker): the reference processor as the
pipeline's processor, poison records to the dead-letter topic, and a processor that is down
for a while costing no record."""

from __future__ import annotations

import threading
from typing import Any

from sidecar_helpers import References

from offtake.testing import MemoryBroker, headers_of, run_pipeline
from offtake_testbed.process import free_port


def manifest(port: int, *, batch: int = 16) -> dict[str, Any]:
    return {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": "sidecar-test", "namespace": "test"},
        "spec": {
            "kafka": {"bootstrapServers": "memory:9092"},
            "source": {"topics": ["orders"], "format": "json"},
            "processor": {
                "container": {
                    "image": "offtake-example-sidecar",
                    "port": port,
                    "timeoutSeconds": 5,
                    "maxBatchRecords": batch,
                }
            },
            "sink": {"kafka": {"topic": "orders-enriched"}},
            "errors": {
                "policy": "dlq",
                "maxRetries": 1,
                "retryBackoffSeconds": 0.01,
                "dlq": {"topic": "orders-dlq"},
            },
            "commit": {"intervalSeconds": 0.1},
        },
    }


def test_a_pipeline_runs_through_the_sidecar(references: References) -> None:
    ref = references.start()
    broker = MemoryBroker()
    broker.create_topic("orders", 4)
    poisoned = {7, 23, 41}
    for i in range(60):
        broker.produce("orders", {"id": i, "name": f"n{i}", "poison": i in poisoned}, key=str(i))

    run = run_pipeline(manifest(ref.port), broker, workers=2, timeout=60)

    assert run.ok, run
    assert sorted(v["id"] for v in run.outputs) == [i for i in range(60) if i not in poisoned]
    assert all(
        v["name"] == f"N{v['id']}" and v["processedBy"] == "example-sidecar" for v in run.outputs
    )
    assert len(run.dlq) == 3
    for message in run.dlq:
        headers = headers_of(message)
        where = "orders/{}/{}".format(
            headers["offtake.original.partition"], headers["offtake.original.offset"]
        )
        assert headers["offtake.error.message"] == (
            f'PoisonRecord: the record has "poison": true (record {where})'
        )
        assert headers["offtake.attempts"] == "1"  # not retriable: straight to the DLQ


def test_a_sidecar_that_starts_late_costs_no_record(python_references: References) -> None:
    port = free_port()
    broker = MemoryBroker()
    broker.create_topic("orders", 2)
    for i in range(40):
        broker.produce("orders", {"id": i}, key=str(i))
    # The engine finds the processor unavailable, retries the batch, and carries on once the
    # container is up: no record is charged, none goes to the dead-letter topic.
    starter = threading.Timer(1.5, lambda: python_references.start(port=port))
    starter.start()
    try:
        run = run_pipeline(manifest(port), broker, workers=1, timeout=60)
    finally:
        starter.join()

    assert run.ok, run
    assert sorted(v["id"] for v in run.outputs) == list(range(40))
    assert run.dlq == []


def test_a_sidecar_killed_mid_stream_loses_nothing(python_references: References) -> None:
    ref = python_references.start("--delay", "0.02")
    broker = MemoryBroker()
    broker.create_topic("orders", 3)
    broker.create_topic("orders-enriched", 1)
    broker.create_topic("orders-dlq", 1)
    for i in range(300):
        broker.produce("orders", {"id": i}, key=str(i))
    outputs = lambda: len(broker.records("orders-enriched"))  # noqa: E731
    at_kill: list[int] = []

    def chaos() -> None:
        # The engine hands the processor a whole poll batch, which the processor sends in
        # chunks of 8 (20 ms each): kill the sidecar in the middle of that.
        threading.Event().wait(0.3)
        ref.proc.kill()  # SIGKILL: the chunk in flight gets no answer
        ref.proc.wait()
        at_kill.append(outputs())
        threading.Event().wait(1.0)
        python_references.start(port=ref.port)

    killer = threading.Thread(target=chaos)
    killer.start()
    try:
        run = run_pipeline(manifest(ref.port, batch=8), broker, workers=1, timeout=90)
    finally:
        killer.join()

    assert run.ok, run
    assert at_kill and at_kill[0] < 300  # the sidecar really died mid-stream
    ids = [v["id"] for v in run.outputs]
    assert set(ids) == set(range(300))  # every record, after the restart
    assert len(ids) - len(set(ids)) <= 8  # at most the batch in flight, sent again
    assert run.dlq == []
