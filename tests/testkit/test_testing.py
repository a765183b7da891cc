"""The public test kit (offtake.testing) running the real engine on the memory broker."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import TopicPartition

from offtake.records import Record
from offtake.testing import (
    MemoryBroker,
    PipelineHarness,
    PipelineTimeout,
    headers_of,
    process,
    run_pipeline,
)


def manifest(**spec: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": "orders-enrich", "namespace": "shop"},
        "spec": {
            "kafka": {"bootstrapServers": "unused:9092"},
            "source": {"topics": ["orders"], "groupId": "g"},
            "sink": {"kafka": {"topic": "enriched"}},
            "commit": {"intervalSeconds": 0.05},
            "shutdown": {"drainTimeoutSeconds": 5},
        },
    }
    doc["spec"].update(spec)
    return doc


def fill(
    broker: MemoryBroker, n: int, partitions: int = 12, poison: frozenset[int] = frozenset()
) -> None:
    broker.create_topic("orders", partitions)
    for i in range(n):
        value: dict[str, Any] = {"id": i}
        if i in poison:
            value["poison"] = True
        broker.produce("orders", value, key=str(i))


def ids(outputs: list[Any]) -> Counter[int]:
    return Counter(o["id"] for o in outputs)


def slow(record: Record) -> Any:
    time.sleep(0.0002)  # enough to keep records in flight while the group changes
    return record.value


# -- process() ----------------------------------------------------------------------------


def test_process_calls_a_function_with_the_workers_convention() -> None:
    assert process("testkit_processors:enrich", {"id": 1}) == [{"id": 1, "enriched": True}]
    assert process("testkit_processors:fan_out", 7) == [7, 7]
    assert process(lambda r: None, {"id": 1}) == []
    seen: list[Record] = []
    process(lambda r: seen.append(r), {"a": 1}, key="k", topic="orders", offset=9)
    r = seen[0]
    assert (r.topic, r.partition, r.offset, r.key, r.value) == ("orders", 0, 9, b"k", {"a": 1})
    assert r.raw_value == b'{"a":1}' and r.timestamp is not None
    assert process(lambda r: r.value, b'{"a": 2}', format="json") == [{"a": 2}]
    assert process(lambda r: r.value, b"text", format="string") == ["text"]
    with pytest.raises(ValueError, match="poison record 3"):
        process("testkit_processors:poison", {"id": 3, "poison": True})


# -- run_pipeline() -------------------------------------------------------------------------


def test_three_workers_pass_every_record_through_exactly_once() -> None:
    broker = MemoryBroker()
    fill(broker, 600)
    run = run_pipeline(manifest(), broker, workers=3)
    assert run.ok, run
    assert run.exit_codes == [0, 0, 0]
    assert ids(run.outputs) == Counter(range(600))
    assert {m.key() for m in run.output_messages} == {str(i).encode() for i in range(600)}
    assert all(off == broker.end_offsets("orders")[p] for (_, p), off in run.committed.items())
    # The group really was shared: three members each owned partitions.
    assigned = {e.member for e in run.events if e.kind == "assign" and e.partitions}
    assert len(assigned) == 3


def test_the_manifests_processor_from_yaml_text_and_file(tmp_path: Path) -> None:
    doc = manifest(processor={"function": "testkit_processors:enrich"})
    broker = MemoryBroker()
    fill(broker, 50, partitions=3)
    run = run_pipeline(yaml.safe_dump(doc), broker)
    assert run.ok and sorted(o["id"] for o in run.outputs) == list(range(50))
    assert all(o["enriched"] for o in run.outputs)
    path = tmp_path / "pipeline.yaml"
    doc["spec"]["source"]["groupId"] = "second"
    doc["spec"]["sink"]["kafka"]["topic"] = "enriched-2"
    path.write_text(yaml.safe_dump(doc))
    run = run_pipeline(path, broker)
    assert run.ok and len(run.outputs) == 50


def test_a_processor_argument_replaces_the_manifests() -> None:
    broker = MemoryBroker()
    fill(broker, 20, partitions=2)
    run = run_pipeline(manifest(), broker, processor=lambda r: {"double": r.value["id"] * 2})
    assert sorted(o["double"] for o in run.outputs) == [2 * i for i in range(20)]


def test_log_sink_commits_everything() -> None:
    broker = MemoryBroker()
    fill(broker, 10, partitions=2)
    run = run_pipeline(manifest(sink={"log": {}}), broker)
    assert run.ok and run.outputs == [] and not any(run.lag.values())


# -- error policies -------------------------------------------------------------------------


def errors(policy: str) -> dict[str, Any]:
    out: dict[str, Any] = {"policy": policy, "maxRetries": 1, "retryBackoffSeconds": 0.01}
    if policy == "dlq":
        out["dlq"] = {"topic": "orders-dlq"}
    return out


def test_poison_records_go_to_the_dead_letter_topic() -> None:
    broker = MemoryBroker()
    fill(broker, 30, partitions=3, poison=frozenset({4, 17}))
    doc = manifest(processor={"function": "testkit_processors:poison"}, errors=errors("dlq"))
    run = run_pipeline(doc, broker, workers=2)
    assert run.ok, run
    assert ids(run.outputs) == Counter(set(range(30)) - {4, 17})
    assert sorted(json.loads(m.value())["id"] for m in run.dlq) == [4, 17]
    originals = {m.key(): m for m in broker.records("orders")}
    for m in run.dlq:
        original = originals[m.key()]
        assert m.value() == original.value()  # byte for byte
        h = headers_of(m)
        assert h["offtake.original.topic"] == "orders"
        assert h["offtake.original.partition"] == str(original.partition())
        assert h["offtake.original.offset"] == str(original.offset())
        assert "poison record" in (h["offtake.error.message"] or "")
        assert h["offtake.attempts"] == "2"


def test_a_user_exception_reaches_the_dlq_and_the_log_with_its_type(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = MemoryBroker()
    fill(broker, 3, partitions=1)
    doc = manifest(processor={"function": "testkit_processors:needs_amount"}, errors=errors("dlq"))
    with caplog.at_level("WARNING", logger="offtake.errors"):
        run = run_pipeline(doc, broker, workers=1)
    assert run.ok, run
    assert len(run.dlq) == 3
    for m in run.dlq:
        assert headers_of(m)["offtake.error.message"] == "KeyError: 'amount'"
    assert any("KeyError: 'amount'" in r.getMessage() for r in caplog.records)


def test_poison_records_are_skipped_under_skip() -> None:
    broker = MemoryBroker()
    fill(broker, 30, partitions=3, poison=frozenset({4, 17}))
    doc = manifest(processor={"function": "testkit_processors:poison"}, errors=errors("skip"))
    run = run_pipeline(doc, broker)
    assert run.ok and ids(run.outputs) == Counter(set(range(30)) - {4, 17}) and run.dlq == []


def test_stop_policy_commits_nothing_past_the_failing_record_and_exits_1() -> None:
    broker = MemoryBroker()
    fill(broker, 10, partitions=1, poison=frozenset({5}))
    doc = manifest(processor={"function": "testkit_processors:poison"}, errors=errors("stop"))
    run = run_pipeline(doc, broker, timeout=20)  # returns once the worker exited by itself
    assert not run.timed_out and run.exit_codes == [1]
    assert run.committed[("orders", 0)] == 5
    assert run.lag[("orders", 0)] == 5 and not run.ok


# -- membership changes -----------------------------------------------------------------


def feed(h: PipelineHarness, n: int, pause_every: int = 100) -> threading.Thread:
    def run() -> None:
        for i in range(n):
            h.produce({"id": i}, key=str(i))
            if i % pause_every == 0:
                time.sleep(0.005)

    t = threading.Thread(target=run)
    t.start()
    return t


@pytest.mark.parametrize("strategy", ["cooperative-sticky", "range"])
def test_workers_stopped_and_added_while_records_flow_lose_nothing(strategy: str) -> None:
    broker = MemoryBroker()
    broker.create_topic("orders", 12)
    config = {"partition.assignment.strategy": strategy}
    doc = manifest(kafka={"bootstrapServers": "x", "config": config})
    with PipelineHarness(doc, broker, processor=slow) as h:
        for _ in range(3):
            h.add_worker()
        producer = feed(h, 3000)
        time.sleep(0.2)
        assert h.stop_worker(0) == 0  # SIGTERM: drains, commits, leaves
        h.add_worker()
        time.sleep(0.2)
        assert h.stop_worker(2) == 0
        producer.join()
        h.wait_until_committed(timeout=30)
        h.stop_all()
        run = h.result()
    assert run.ok, run
    assert ids(run.outputs) == Counter(range(3000))  # none lost, none twice
    assert run.rejected_commits == []


def test_killed_worker_loses_nothing_and_duplicates_at_most_the_in_flight_limit() -> None:
    broker = MemoryBroker()
    broker.create_topic("orders", 12)
    limit = 100
    doc = manifest(limits={"maxInFlightMessages": limit}, commit={"intervalSeconds": 0.5})
    with PipelineHarness(doc, broker, processor=slow) as h:
        for _ in range(3):
            h.add_worker()
        producer = feed(h, 3000)
        time.sleep(0.3)
        h.kill_worker(1)  # SIGKILL: no drain, no commit, no leave
        h.add_worker()
        producer.join()
        h.wait_until_committed(timeout=30)
        h.stop_all()
        run = h.result()
    counts = ids(run.outputs)
    assert set(counts) == set(range(3000))  # nothing lost
    duplicates = sum(counts.values()) - len(counts)
    assert duplicates <= limit
    assert run.exit_codes[1] is None and run.ok, run
    assert any(e.kind == "lost" and e.partitions for e in run.events)


def test_a_stalled_sink_pauses_partitions_without_a_rebalance_and_resumes() -> None:
    broker = MemoryBroker()
    fill(broker, 0, partitions=4)
    limit = 40
    doc = manifest(
        kafka={"bootstrapServers": "x", "config": {"max.poll.interval.ms": "1000"}},
        limits={"maxInFlightMessages": limit},
    )
    with PipelineHarness(doc, broker) as h:
        h.add_worker()
        h.wait_ready()
        generation = broker.generation("g")
        broker.stall("enriched", 3.0)  # longer than max.poll.interval.ms
        for i in range(400):
            h.produce({"id": i}, key=str(i))
        consumer = h.workers[0].clients.consumers[0]
        parts = [TopicPartition("orders", p) for p in range(4)]
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            fetched = sum(max(0, tp.offset) for tp in consumer.position(parts))
            committed = sum(broker.committed("g", "orders", p) or 0 for p in range(4))
            assert fetched - committed <= limit  # in-flight work stays bounded
            time.sleep(0.05)
        assert broker.committed("g", "orders", 0) in (None, 0) and broker.records("enriched") == []
        h.wait_until_committed(timeout=20)
        assert broker.generation("g") == generation  # it kept polling: no rebalance
        run = h.result()
    assert not [e for e in run.events if e.kind == "lost"]
    assert run.ok and ids(run.outputs) == Counter(range(400))


# -- waiting ----------------------------------------------------------------------------------


def test_a_wait_that_times_out_raises_with_the_run() -> None:
    broker = MemoryBroker()
    fill(broker, 5, partitions=1)
    broker.stall("enriched")  # the sink never confirms, so nothing is ever committed
    with pytest.raises(PipelineTimeout) as info:
        run_pipeline(manifest(shutdown={"drainTimeoutSeconds": 0.2}), broker, timeout=1.0)
    assert info.value.run.timed_out and info.value.run.lag == {("orders", 0): 5}
    assert "orders[0]=5" in str(info.value)


def test_until_and_wait_ready_for_latest_pipelines() -> None:
    broker = MemoryBroker()
    fill(broker, 5, partitions=1)
    doc = manifest()
    doc["spec"]["source"]["startFrom"] = "latest"
    with PipelineHarness(doc, broker) as h:
        h.add_worker()
        h.wait_ready()
        for i in range(5, 8):
            h.produce({"id": i})
        h.wait_until(lambda: len(h.outputs()) == 3, timeout=10)
    assert sorted(o["id"] for o in h.outputs()) == [5, 6, 7]


def both_own_partitions(broker: MemoryBroker) -> bool:
    owned = broker.assignment("g")
    return len(owned) == 2 and all(owned.values())


def test_static_membership_holds_a_stopped_workers_partitions_until_it_returns() -> None:
    """With group.instance.id (the pod name), a graceful stop does not hand partitions over:
    they wait for the same instance (a restarted pod) or for session.timeout.ms."""
    broker = MemoryBroker()
    fill(broker, 0, partitions=4)
    doc = manifest(kafka={"bootstrapServers": "x", "config": {"session.timeout.ms": "60000"}})
    with PipelineHarness(doc, broker) as h:
        h.add_worker(instance_id="pod-0")
        h.add_worker(instance_id="pod-1")
        h.wait_ready()
        h.wait_until(lambda: both_own_partitions(broker), timeout=10)
        generation = broker.generation("g")
        assert h.stop_worker(0) == 0
        for i in range(40):
            h.produce({"id": i}, key=str(i))
        time.sleep(1.0)
        assert broker.generation("g") == generation  # no rebalance: pod-1 did not take over
        assert any(broker.lag("g").values())
        h.add_worker(instance_id="pod-0")  # the restarted pod
        h.wait_until_committed(timeout=10)
        assert broker.generation("g") == generation
        run = h.result()
    assert ids(run.outputs) == Counter(range(40))


def _fetched_not_committed(h: PipelineHarness, worker: int, partitions: int) -> int:
    consumer = h.workers[worker].clients.consumers[0]
    parts = [TopicPartition("orders", p) for p in range(partitions)]
    return sum(
        tp.offset - (h.broker.committed("g", "orders", tp.partition) or 0)
        for tp in consumer.position(parts)
        if tp.offset >= 0
    )


def test_partitions_gained_during_backpressure_stay_within_the_in_flight_bound() -> None:
    broker = MemoryBroker()
    fill(broker, 0, partitions=4)
    limit = 40
    doc = manifest(limits={"maxInFlightMessages": limit}, shutdown={"drainTimeoutSeconds": 1})
    with PipelineHarness(doc, broker) as h:
        h.add_worker()
        h.add_worker()
        h.wait_until(lambda: both_own_partitions(broker), timeout=10)
        broker.stall("enriched")  # the sink hangs: both workers fill up and pause
        for i in range(2000):
            h.produce({"id": i}, key=str(i))
        h.wait_until(lambda: _fetched_not_committed(h, 0, 4) >= limit, timeout=10)
        h.wait_until(lambda: _fetched_not_committed(h, 1, 4) >= limit, timeout=10)
        h.stop_worker(1)  # worker 0 gains its partitions while under backpressure
        deadline = time.monotonic() + 1.0
        worst = 0
        while time.monotonic() < deadline:
            worst = max(worst, _fetched_not_committed(h, 0, 4))
            time.sleep(0.02)
        broker.unstall("enriched")
        h.wait_until_committed(timeout=20)
    assert worst <= limit, worst


def test_failed_sink_deliveries_go_to_the_dead_letter_topic() -> None:
    broker = MemoryBroker()
    fill(broker, 20, partitions=2)
    broker.fail_produce("enriched", 3)  # the next three deliveries to the sink fail
    run = run_pipeline(manifest(errors=errors("dlq")), broker)
    assert run.ok, run
    assert len(run.outputs) == 17 and len(run.dlq) == 3
    assert ids(run.outputs) + Counter(json.loads(m.value())["id"] for m in run.dlq) == Counter(
        range(20)
    )
    assert {headers_of(m)["offtake.error.stage"] for m in run.dlq} == {"sink"}


def test_latest_start_position_is_kept_across_a_restart() -> None:
    broker = MemoryBroker()
    fill(broker, 0, partitions=2)
    doc = manifest()
    doc["spec"]["source"]["startFrom"] = "latest"
    with PipelineHarness(doc, broker) as h:
        h.add_worker()
        h.wait_ready()
        assert h.stop_worker(0) == 0  # deployed, then stopped before any record arrived
        for i in range(10):
            h.produce({"id": i}, key=str(i))  # produced after the pipeline first started
        h.add_worker()
        h.wait_until(lambda: len(h.outputs()) >= 10, timeout=5)
    assert sorted(o["id"] for o in h.outputs()) == list(range(10))
