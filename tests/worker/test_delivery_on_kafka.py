"""Delivery semantics of real worker processes on a real Kafka broker.

Each test reports the lost and duplicated counts it measured (printed, and appended to
``$OFFTAKE_REPORT`` when set) so that a run's numbers can be quoted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.reports import lost_and_duplicated, report
from support.workers import (
    SteadyFlow,
    WorkerProcess,
    committed_records,
    ids_of,
    manifest,
    produce,
    read_all,
    wait_caught_up,
    write_manifest,
)

from offtake_testbed.kafka import KafkaBroker


@pytest.mark.parametrize("assignor", ["cooperative-sticky", "range"])
def test_three_workers_rebalance_while_records_flow_lose_and_duplicate_nothing(
    assignor: str, kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src, out = topic_factory(12), topic_factory(12)
    doc = manifest("rebalance", kafka_broker.bootstrap, [src], sink={"kafka": {"topic": out}})
    # cooperative-sticky is the default; eager assignors are selectable through kafka.config.
    doc["spec"]["kafka"]["config"]["partition.assignment.strategy"] = assignor
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    total = 30_000

    # Records keep arriving during both rebalances.
    flow = SteadyFlow(kafka_broker.bootstrap, src, 1000, 0.4, total).start()
    workers = [WorkerProcess(path, tmp_path / f"w{i}.log").start() for i in range(3)]
    # Stopped once it owns partitions and records flow through it, not after a fixed time: on a
    # loaded machine 5 s could end it before its interpreter had started (exit -15, nothing
    # of the rebalance under test exercised).
    w0 = workers[0]
    w0.wait_until(lambda: "assigned " in w0.output(), "its first assignment", timeout=120)
    w0.wait_until(
        lambda: w0.metric("offtake_messages_processed_total") > 0, "records through it", 120
    )
    assert w0.terminate() == 0, w0.output()
    # The fourth joins once the two left own every partition between them (the first
    # rebalance over), so that its join is a second rebalance, not part of the first.
    w1, w2 = workers[1:]
    w1.wait_until(
        lambda: sum(w.metric("offtake_assigned_partitions") for w in (w1, w2)) == 12,
        "every partition owned by the two left",
        timeout=120,
    )
    workers.append(WorkerProcess(path, tmp_path / "w3.log").start())
    flow.join()
    wait_caught_up(kafka_broker.bootstrap, doc["spec"]["source"]["groupId"], src, 12)
    codes = [w.terminate() for w in workers[1:]]
    assert codes == [0, 0, 0], [w.output()[-2000:] for w in workers]
    counts = ids_of(read_all(kafka_broker.bootstrap, out))
    lost, duplicated = lost_and_duplicated(total, counts)
    report(
        f"rebalance-{assignor}",
        produced=total,
        delivered=sum(counts.values()),
        lost=lost,
        duplicated=duplicated,
    )
    assert "revoked" in workers[1].output() or "revoked" in workers[2].output()
    assert (lost, duplicated) == (0, 0)


def test_sigkill_mid_stream_loses_nothing_and_duplicates_at_most_the_in_flight_limit(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src, out = topic_factory(4), topic_factory(4)
    limit = 500
    doc = manifest(
        "sigkill",
        kafka_broker.bootstrap,
        [src],
        sink={"kafka": {"topic": out}},
        processor={"function": "support.processors:slow"},
        limits={"maxInFlightMessages": limit},
        commit={"intervalSeconds": 5.0},
    )
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    total = produce(kafka_broker.bootstrap, src, ({"id": i} for i in range(8_000)))
    first = WorkerProcess(path, tmp_path / "first.log").start()
    # Mid-stream: the first commit landed (some records committed), the rest is in flight or
    # not yet read (the slow function needs 16 s for all of them; a commit comes every 5 s).
    # Waiting for the commit, not for a fixed time, keeps a slow machine from killing it before
    # it started consuming.
    group = doc["spec"]["source"]["groupId"]
    first.wait_until(
        lambda: committed_records(kafka_broker.bootstrap, group, src, 4) > 0,
        "a first commit",
        timeout=120,
        every=0.2,  # each check opens a consumer
    )
    # Killed with records taken but not committed, as in a crash: the worker's in-flight gauge
    # (consumed and not yet committed) shows some. Commits come when the in-flight bound is
    # reached as well as every 5 s, so that gauge, not the group's offsets, says it.
    first.wait_until(
        lambda: first.metric("offtake_inflight_messages") > 0, "records in flight", every=0.05
    )
    first.kill()
    delivered_before_restart = len(read_all(kafka_broker.bootstrap, out))
    assert 0 < delivered_before_restart < total, "the kill must land mid-stream"
    second = WorkerProcess(path, tmp_path / "second.log").start()
    wait_caught_up(kafka_broker.bootstrap, doc["spec"]["source"]["groupId"], src, 4)
    assert second.terminate() == 0, second.output()[-2000:]
    counts = ids_of(read_all(kafka_broker.bootstrap, out))
    lost, duplicated = lost_and_duplicated(total, counts)
    report(
        "sigkill",
        produced=total,
        delivered=sum(counts.values()),
        lost=lost,
        duplicated=duplicated,
        in_flight_limit=limit,
        delivered_before_kill=delivered_before_restart,
    )
    assert lost == 0
    assert duplicated <= limit


@pytest.mark.parametrize("policy", ["dlq", "skip", "stop"])
def test_poison_record_under_each_error_policy(
    policy: str, kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src, out, dlq = topic_factory(1), topic_factory(1), topic_factory(1)
    errors: dict[str, Any] = {"policy": policy, "maxRetries": 2, "retryBackoffSeconds": 0.05}
    if policy == "dlq":
        errors["dlq"] = {"topic": dlq}
    doc = manifest(
        f"poison-{policy}",
        kafka_broker.bootstrap,
        [src],
        sink={"kafka": {"topic": out}},
        processor={"function": "support.processors:poison"},
        errors=errors,
    )
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    attempts_file = tmp_path / "attempts"
    produce(kafka_broker.bootstrap, src, ({"id": i, "poison": i == 50} for i in range(100)))
    group = doc["spec"]["source"]["groupId"]
    worker = WorkerProcess(
        path, tmp_path / "w.log", env={"OFFTAKE_TEST_ATTEMPTS_FILE": str(attempts_file)}
    ).start()
    if policy == "stop":
        code = worker.wait(60)
        assert code == 1, worker.output()[-3000:]
        assert "[0]@50 failed in process" in worker.output()
        from support.workers import committed

        assert (
            committed(kafka_broker.bootstrap, group, src, 1)[0] == 50
        )  # nothing at or past the poison record
        assert len(attempts_file.read_text().split()) == 3  # first try + maxRetries
        report("poison-stop", exit_code=code, committed=50)
        return
    wait_caught_up(kafka_broker.bootstrap, group, src, 1, timeout=60)
    assert worker.terminate() == 0, worker.output()[-2000:]
    attempts = len(attempts_file.read_text().split())
    assert attempts == 3
    outputs = ids_of(read_all(kafka_broker.bootstrap, out))
    assert sorted(outputs) == [i for i in range(100) if i != 50]
    dead = read_all(kafka_broker.bootstrap, dlq)
    if policy == "dlq":
        assert len(dead) == 1
        msg = dead[0]
        assert json.loads(msg.value()) == {"id": 50, "poison": True}
        assert msg.key() == b"50"
        headers = {k: v.decode() for k, v in msg.headers()}
        assert headers["offtake.original.topic"] == src
        assert headers["offtake.original.partition"] == "0"
        assert headers["offtake.original.offset"] == "50"
        assert headers["offtake.original.timestamp"].isdigit()
        assert headers["offtake.error.class"] == "builtins.ValueError"
        assert "poison record 50" in headers["offtake.error.message"]
        assert headers["offtake.attempts"] == "3"
    else:
        assert dead == []
        assert "skipped (errors.policy=skip)" in worker.output()
    report(f"poison-{policy}", outputs=sum(outputs.values()), dlq=len(dead), attempts=attempts)


def test_start_from_latest_keeps_its_place_across_a_restart(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src, out = topic_factory(3), topic_factory(3)
    produce(kafka_broker.bootstrap, src, ({"id": -1 - i} for i in range(30)))  # before: skipped
    doc = manifest("latest", kafka_broker.bootstrap, [src], sink={"kafka": {"topic": out}})
    doc["spec"]["source"]["startFrom"] = "latest"
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    group = doc["spec"]["source"]["groupId"]
    first = WorkerProcess(path, tmp_path / "first.log").start()
    # Deployed, no record arrives, stopped: the start position must be committed anyway.
    wait_caught_up(kafka_broker.bootstrap, group, src, 3, timeout=60)
    assert first.terminate() == 0, first.output()[-2000:]
    produce(kafka_broker.bootstrap, src, ({"id": i} for i in range(100)))  # while it is down
    second = WorkerProcess(path, tmp_path / "second.log").start()
    wait_caught_up(kafka_broker.bootstrap, group, src, 3, timeout=60)
    assert second.terminate() == 0, second.output()[-2000:]
    assert sorted(ids_of(read_all(kafka_broker.bootstrap, out))) == list(range(100))
