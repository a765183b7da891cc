"""sink.kafka.delivery exactly-once on the real broker: kills, rebalances and dead letters.

A read_committed reader of the output must see every input record exactly once, however the
workers were stopped. Each test reports what it measured (support.reports), including how
many records aborted transactions left in the log (what a read_uncommitted reader would see).
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from support.reports import assert_each_once
from support.workers import (
    SteadyFlow,
    WorkerProcess,
    committed_records,
    dead_lettering,
    end_offsets,
    exactly_once_manifest,
    ids_of,
    produce,
    wait_caught_up,
    write_manifest,
)

from offtake_testbed.kafka import KafkaBroker, read_topic

pytestmark = pytest.mark.kafka


def read_isolated(bootstrap: str, topic: str, isolation: str) -> list[Any]:
    return read_topic(bootstrap, topic, timeout=90.0, isolation=isolation)


def test_sigkills_mid_stream_lose_and_duplicate_nothing(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src, out = topic_factory(4), topic_factory(4)
    doc = exactly_once_manifest(
        "eos-kill",
        kafka_broker.bootstrap,
        src,
        out,
        processor={"function": "support.processors:slow"},
        commit={"intervalSeconds": 0.5},
    )
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    group = doc["spec"]["source"]["groupId"]
    total = produce(kafka_broker.bootstrap, src, ({"id": i} for i in range(20_000)))
    # One pod whose container is restarted: same name, so the same transactional.id, and
    # each start fences and aborts what the killed one left open.
    env = {"OFFTAKE_TEST_SLOW_SECONDS": "0.0005", "POD_NAME": "eos-kill-0"}
    kills = 3
    rng = random.Random(7)
    for k in range(kills):
        worker = WorkerProcess(path, tmp_path / f"w{k}.log", env=env).start()
        floor = (k + 1) * total // (kills + 2)
        worker.wait_until(
            lambda f=floor: committed_records(kafka_broker.bootstrap, group, src, 4) > f,
            f"more than {floor} records committed",
            timeout=120,
            every=0.2,
        )
        # Pacing the fault, not waiting for the worker: a random moment between commits (every
        # 0.5 s), so the kills land at different points of an open transaction.
        time.sleep(rng.uniform(0.1, 0.6))
        worker.kill()
    last = WorkerProcess(path, tmp_path / "last.log", env=env).start()
    wait_caught_up(kafka_broker.bootstrap, group, src, 4, timeout=180)
    assert last.terminate() == 0, last.output()[-2000:]
    counts = ids_of(read_isolated(kafka_broker.bootstrap, out, "read_committed"))
    in_log = len(read_isolated(kafka_broker.bootstrap, out, "read_uncommitted"))
    delivered = sum(counts.values())
    assert_each_once(
        "exactly-once-sigkill",
        total,
        counts,
        kills=kills,
        delivered=delivered,
        aborted_in_log=in_log - delivered,
    )


def test_rolling_replacement_under_flow_loses_and_duplicates_nothing(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src, out = topic_factory(6), topic_factory(6)
    doc = exactly_once_manifest("eos-roll", kafka_broker.bootstrap, src, out)
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    total = 12_000

    flow = SteadyFlow(kafka_broker.bootstrap, src, 1000, 0.4, total).start()
    workers = [WorkerProcess(path, tmp_path / f"w{i}.log").start() for i in range(2)]
    # Up before the replacement: on a busy machine, a SIGTERM before the worker set its signal
    # handler (it logs "connecting to Kafka" after) would end it with -15 instead of a drain.
    for w in workers:
        w.wait_until(lambda w=w: "connecting to Kafka" in w.output(), "the worker started")
    for w in workers:  # both in the group, copying the flow
        w.wait_until(lambda w=w: w.metric("offtake_messages_processed_total") > 0, "records")
    new = WorkerProcess(path, tmp_path / "w2.log").start()
    workers.append(new)
    # The new pod is up and in the group (it owns partitions) before the old one is stopped.
    new.wait_until(lambda: new.metric("offtake_assigned_partitions") > 0, "its partitions")
    assert workers[0].terminate() == 0, workers[0].output()[-2000:]  # ...old pod SIGTERMed
    flow.join()
    wait_caught_up(kafka_broker.bootstrap, doc["spec"]["source"]["groupId"], src, 6, timeout=120)
    codes = [w.terminate() for w in workers[1:]]
    assert codes == [0, 0], [w.output()[-2000:] for w in workers]
    counts = ids_of(read_isolated(kafka_broker.bootstrap, out, "read_committed"))
    assert_each_once("exactly-once-rolling", total, counts)


def test_dead_letters_are_part_of_the_transaction(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src, out, dlq = topic_factory(2), topic_factory(2), topic_factory(1)
    doc = exactly_once_manifest(
        "eos-dlq",
        kafka_broker.bootstrap,
        src,
        out,
        processor={"function": "support.processors:poison"},
        errors=dead_lettering(dlq, retries=1, backoff=0.05),
    )
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    records = ({"id": i, "poison": i % 100 == 0} for i in range(2_000))
    total = produce(kafka_broker.bootstrap, src, records)
    worker = WorkerProcess(path, tmp_path / "w.log").start()
    wait_caught_up(kafka_broker.bootstrap, doc["spec"]["source"]["groupId"], src, 2)
    assert worker.terminate() == 0, worker.output()[-2000:]
    delivered = ids_of(read_isolated(kafka_broker.bootstrap, out, "read_committed"))
    dead = ids_of(read_isolated(kafka_broker.bootstrap, dlq, "read_committed"))
    assert sorted(dead) == list(range(0, total, 100)) and set(dead.values()) == {1}
    assert len(delivered) == total - len(dead) and set(delivered.values()) == {1}
    assert not set(delivered) & set(dead)


def test_sigterm_commits_the_open_transaction(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    """A graceful stop ends the transaction: nothing is left for the successor to redo."""
    src, out = topic_factory(1), topic_factory(1)
    doc = exactly_once_manifest(
        "eos-term", kafka_broker.bootstrap, src, out, commit={"intervalSeconds": 60}
    )
    # The transaction stays open until the stop: the broker must not end it first. With the
    # test bed's 10 s transaction timeout it aborted the transaction (and fenced the worker)
    # whenever the 500 records took longer than that to go through on a loaded machine.
    doc["spec"]["sink"]["kafka"]["config"]["transaction.timeout.ms"] = "300000"
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    group = doc["spec"]["source"]["groupId"]
    total = produce(kafka_broker.bootstrap, src, ({"id": i} for i in range(500)))
    worker = WorkerProcess(path, tmp_path / "w.log").start()
    worker.wait_until(lambda: "assigned" in worker.output(), "an assignment", timeout=60)
    # Consumed and produced (the output's log holds every record), but the interval (60 s)
    # has not ended the transaction: only the stop can commit it.
    worker.wait_until(
        lambda: end_offsets(kafka_broker.bootstrap, out, 1)[0] >= total,
        "every record produced into the open transaction",
        every=0.2,
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()[-2000:]
    assert committed_records(kafka_broker.bootstrap, group, src, 1) == total
    assert sorted(ids_of(read_isolated(kafka_broker.bootstrap, out, "read_committed"))) == list(
        range(total)
    )


def test_a_broker_refusing_transactions_is_a_clear_error_and_commits_nothing(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src, out = topic_factory(1), topic_factory(1)
    doc = exactly_once_manifest("eos-refused", kafka_broker.bootstrap, src, out)
    # Above the broker's transaction.max.timeout.ms (15 min): InitProducerId is refused.
    doc["spec"]["sink"]["kafka"]["config"]["transaction.timeout.ms"] = "3600000"
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    produce(kafka_broker.bootstrap, src, ({"id": i} for i in range(10)))
    worker = WorkerProcess(path, tmp_path / "w.log").start()
    code = worker.wait(60)
    text = worker.output()
    assert code == 3, text[-2000:]
    assert "spec.sink.kafka.delivery: exactly-once needs Kafka transactions" in text
    assert "Traceback" not in text
    assert committed_records(kafka_broker.bootstrap, doc["spec"]["source"]["groupId"], src, 1) == 0
