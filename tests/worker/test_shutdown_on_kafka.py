"""Shutdown never hangs (issue 23, item 7): a worker stopped with SIGTERM revokes, drains and
commits before close() (a dynamic member by unsubscribing and polling until nothing is
assigned, as librdkafka's maintainers advise; a static member locally, keeping its
membership), exits 0 within the watchdog's bound having committed everything, and a static
member's restart (same group.instance.id) resumes where it stopped, duplicating nothing."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.workers import (
    WorkerProcess,
    committed,
    end_offsets,
    ids_of,
    manifest,
    produce,
    read_all,
    wait_caught_up,
    write_manifest,
)

from offtake.engine.worker import WATCHDOG_MARGIN
from offtake_testbed.kafka import KafkaBroker

DRAIN = 5  # shutdown.drainTimeoutSeconds of the pipeline below


@pytest.mark.parametrize("membership", ["static", "dynamic"])
def test_sigterm_exits_0_within_the_bound_and_the_restart_resumes_without_duplicates(
    membership: str, kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src, out = topic_factory(3), topic_factory(1)
    doc = manifest(membership, kafka_broker.bootstrap, [src], sink={"kafka": {"topic": out}})
    if membership == "static":  # group.instance.id through kafka.config
        doc["spec"]["kafka"]["config"]["group.instance.id"] = f"static-{uuid.uuid4().hex[:6]}"
    doc["spec"]["shutdown"] = {"drainTimeoutSeconds": DRAIN}
    path = write_manifest(tmp_path / "p.yaml", doc)
    group = doc["spec"]["source"]["groupId"]
    produce(kafka_broker.bootstrap, src, ({"id": i} for i in range(300)))

    first = WorkerProcess(path, tmp_path / "w1.log").start()
    wait_caught_up(kafka_broker.bootstrap, group, src, 3, timeout=60)
    produce(kafka_broker.bootstrap, src, ({"id": i} for i in range(300, 600)))
    first.signal(signal.SIGTERM)  # while the second 300 arrive: in flight, drained, committed
    started = time.monotonic()
    code = first.wait(DRAIN + WATCHDOG_MARGIN + 5)
    took = time.monotonic() - started

    log = first.output()
    assert code == 0, log[-3000:]
    assert took < DRAIN + WATCHDOG_MARGIN, f"exited after {took:.1f}s"
    assert "shutdown watchdog" not in log and "still assigned" not in log, log[-3000:]
    # Revoked (drained, committed) once, before close(): not again by close()'s callback.
    assert log.count("revoked 3 partition(s)") == 1, log[-3000:]
    done_by_first = committed(kafka_broker.bootstrap, group, src, 3)
    delivered_by_first = ids_of(read_all(kafka_broker.bootstrap, out))
    assert sum(delivered_by_first.values()) == sum(done_by_first.values()), (
        "committed exactly what it delivered"
    )

    # What arrives while it is down is the restarted worker's to deliver.
    produce(kafka_broker.bootstrap, src, ({"id": i} for i in range(600, 900)))
    second = WorkerProcess(path, tmp_path / "w2.log").start()  # static: the same instance id
    wait_caught_up(kafka_broker.bootstrap, group, src, 3, timeout=60)
    assert second.terminate() == 0, second.output()[-3000:]

    delivered = ids_of(read_all(kafka_broker.bootstrap, out))
    assert sorted(delivered) == list(range(900)), "nothing lost"
    assert max(delivered.values()) == 1, "nothing delivered twice across the restart"
    assert committed(kafka_broker.bootstrap, group, src, 3) == end_offsets(
        kafka_broker.bootstrap, src, 3
    )
