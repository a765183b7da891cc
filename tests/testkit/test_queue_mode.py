"""Queue mode (source.groupType share) on the memory broker's share groups, with the real engine.

The same behaviours run on Kafka in tests/worker/test_queue_mode_on_kafka.py, with processes.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from offtake.records import Record
from offtake.testing import MemoryBroker, PipelineHarness, headers_of

N = 600


def manifest(**spec: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": "jobs", "namespace": "shop"},
        "spec": {
            # Polls of 50: a worker's poll is one unit of work, acknowledged before the next.
            "kafka": {"bootstrapServers": "unused:9092", "config": {"max.poll.records": "50"}},
            "source": {"topics": ["jobs"], "groupId": "g", "groupType": "share"},
            "sink": {"kafka": {"topic": "done"}},
            "shutdown": {"drainTimeoutSeconds": 5},
        },
    }
    doc["spec"].update(spec)
    return doc


def fill(broker: MemoryBroker, n: int, poison: frozenset[int] = frozenset()) -> None:
    broker.create_topic("jobs", 2)
    for i in range(n):
        broker.produce("jobs", {"id": i, "poison": i in poison}, key=str(i))


def ids(h: PipelineHarness) -> Counter[int]:
    return Counter(o["id"] for o in h.outputs())


def slow(record: Record) -> Any:
    time.sleep(0.002)
    if record.value["poison"]:
        raise ValueError(f"poison {record.value['id']}")
    return record.value


def test_more_workers_than_partitions_all_get_work_and_each_record_is_delivered_once() -> None:
    broker = MemoryBroker()
    fill(broker, N)
    with PipelineHarness(manifest(), broker, processor=slow) as h:
        for _ in range(3):
            h.add_worker()
        h.wait_until(lambda: len(ids(h)) == N)
        assert h.stop_all() == [0, 0, 0]
    assert set(ids(h).values()) == {1}
    acquired = [w.worker.metrics.share_acquired.labels("jobs")._value.get() for w in h.workers]
    assert all(acquired), acquired  # 3 workers, 2 partitions: every worker had records
    states = broker.share_states("g", "jobs")
    assert {state for state, _ in states.values()} == {"acknowledged"}


def test_a_poison_record_reaches_the_dlq_after_max_retries_counted_by_deliveries() -> None:
    broker = MemoryBroker()
    fill(broker, 50, poison=frozenset({7}))
    spec = manifest(
        errors={"policy": "dlq", "maxRetries": 2, "retryBackoffSeconds": 0, "dlq": {"topic": "dlq"}}
    )
    with PipelineHarness(spec, broker, processor=slow) as h:
        h.add_worker()
        h.wait_until(lambda: len(ids(h)) == 49 and len(h.dlq()) == 1)
        assert h.stop_all() == [0]
    (dead,) = h.dlq()
    assert headers_of(dead)["offtake.attempts"] == "3"  # maxRetries 2: three attempts
    assert {state for state, _ in broker.share_states("g", "jobs").values()} == {"acknowledged"}


def test_a_poison_record_skipped_by_policy_is_rejected_never_delivered_again() -> None:
    """No DLQ (errors.policy: skip): once maxRetries deliveries are spent, the record is the
    broker's dead end: REJECT archives it, where ACCEPT would claim it was processed."""
    broker = MemoryBroker()
    fill(broker, 50, poison=frozenset({7}))
    spec = manifest(errors={"policy": "skip", "maxRetries": 2, "retryBackoffSeconds": 0})
    with PipelineHarness(spec, broker, processor=slow) as h:
        h.add_worker()
        h.wait_until(lambda: len(ids(h)) == 49)
        metrics = h.workers[0].worker.metrics
        h.wait_until(lambda: metrics.share_acknowledged.labels("reject")._value.get() == 1)
        assert h.stop_all() == [0]
    states = broker.share_states("g", "jobs")
    assert sorted(state for state, _ in states.values()) == ["acknowledged"] * 49 + ["archived"]
    assert metrics.share_acknowledged.labels("accept")._value.get() == 49
    assert 7 not in ids(h)


def slower(record: Record) -> Any:
    time.sleep(0.03)
    return record.value


def test_a_graceful_stop_releases_what_it_holds_and_duplicates_nothing() -> None:
    """The drain budget (0.5 s) is shorter than a poll's work (50 records of 30 ms): what the
    stopping worker did not deliver, it releases, and the other worker delivers it."""
    broker = MemoryBroker()
    fill(broker, 300)
    spec = manifest(shutdown={"drainTimeoutSeconds": 0.5})
    with PipelineHarness(spec, broker, processor=slower) as h:
        h.add_worker()
        h.add_worker()
        source: Any = h.workers[0].worker.source
        h.wait_until(lambda: source.acquired > 0)  # a poll of 50 in hand: 1.5 s of work
        assert h.stop_worker(0) == 0
        h.wait_until(lambda: len(ids(h)) == 300, timeout=60)
        h.stop_all()
    assert set(ids(h).values()) == {1}  # nothing twice, nothing lost
    released = h.workers[0].worker.metrics.share_acknowledged.labels("release")._value.get()
    assert released > 0  # the stopped worker gave records back


def test_a_killed_worker_loses_nothing_its_locks_expire() -> None:
    broker = MemoryBroker()
    fill(broker, N)
    broker.configure_share_group("g", {"share.record.lock.duration.ms": "1000"})
    with PipelineHarness(manifest(), broker, processor=slow) as h:
        h.add_worker()
        h.add_worker()
        h.wait_until(lambda: len(ids(h)) > N // 4)
        h.kill_worker(0)
        h.wait_until(lambda: len(ids(h)) == N, timeout=30)
        h.stop_all()
    counts = ids(h)
    assert set(counts) == set(range(N))  # nothing lost
    assert sum(counts.values()) - N <= 50  # duplicates: at most the poll it held
