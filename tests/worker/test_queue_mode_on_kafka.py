"""Queue mode (source.groupType share) with real worker processes on the test bed's Kafka 4.3.

Short variants (a few thousand records). Each test reports what it measured (printed, and
appended to ``$OFFTAKE_REPORT`` when set).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families
from support.reports import assert_each_once, lost_and_duplicated, report
from support.workers import (
    SteadyFlow,
    WorkerProcess,
    dead_lettering,
    ids_of,
    produce,
    queue_manifest,
    read_all,
    write_manifest,
)

from offtake_operator import share_backlog
from offtake_operator.kubectl import status_view, worker_metrics
from offtake_testbed.kafka import KafkaBroker


def acquired(worker: WorkerProcess) -> float:
    return worker.metric("offtake_share_acquired_total")


def wait_delivered(bootstrap: str, out: str, total: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while len(set(ids_of(read_all(bootstrap, out)))) < total:
        assert time.monotonic() < deadline, "not every record was delivered in time"
        time.sleep(0.5)


def test_six_workers_on_two_partitions_all_receive_work(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src, out = topic_factory(2), topic_factory(2)
    doc = queue_manifest(
        "queue-six",
        kafka_broker.bootstrap,
        src,
        out,
        processor={"function": "support.processors:slow"},
    )
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    env = {"OFFTAKE_TEST_SLOW_SECONDS": "0.01"}  # 100 records/s a worker: six are needed
    workers = [WorkerProcess(path, tmp_path / f"w{i}.log", env).start() for i in range(6)]
    for w in workers:
        w.metrics_port(timeout=120)
    # Records flow until every worker has acquired some, not for a fixed number of them: on a
    # loaded machine a worker may join the share group after a fixed flow has been drained
    # by the others (and the test would fail for a join that came late, not lost work).
    with SteadyFlow(kafka_broker.bootstrap, src, 150, 0.5) as flow:
        deadline = time.monotonic() + 120
        while not all(acquired(w) for w in workers):
            assert time.monotonic() < deadline, [acquired(w) for w in workers]
            time.sleep(0.5)
        total = flow.stop()
    wait_delivered(kafka_broker.bootstrap, out, total)
    shares = [acquired(w) for w in workers]
    codes = [w.terminate() for w in workers]
    assert codes == [0] * 6, [w.output()[-2000:] for w in workers]
    assert all(shares), shares
    assert_each_once(
        "queue-six-workers", total, ids_of(read_all(kafka_broker.bootstrap, out)), acquired=shares
    )


def two_slow_workers(
    name: str, bootstrap: str, topic_factory: Any, tmp_path: Path
) -> tuple[WorkerProcess, WorkerProcess, int, str]:
    """Two workers of one share group on 4,000 records of a 2-partition topic, each record
    taking 2 ms, once the first has acknowledged records: (first, second, records, output)."""
    src, out = topic_factory(2), topic_factory(2)
    doc = queue_manifest(
        name, bootstrap, src, out, processor={"function": "support.processors:slow"}
    )
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    total = produce(bootstrap, src, ({"id": i} for i in range(4_000)))
    env = {"OFFTAKE_TEST_SLOW_SECONDS": "0.002"}
    first = WorkerProcess(path, tmp_path / "first.log", env).start()
    second = WorkerProcess(path, tmp_path / "second.log", env).start()
    first.wait_until(
        lambda: first.metric("offtake_share_acknowledged_total") > 0, "records through it"
    )
    return first, second, total, out


def test_sigkill_loses_nothing_and_duplicates_only_what_it_had_acquired(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    first, second, total, out = two_slow_workers(
        "queue-kill", kafka_broker.bootstrap, topic_factory, tmp_path
    )
    # What it holds: acquired and not acknowledged (a poll is what the broker hands out: up
    # to share.partition.max.record.locks, 2,000, a partition, in whole producer batches;
    # max.poll.records, 10,000 in the worker, is only the fetch's soft limit).
    took = acquired(first)
    held = took - first.metric("offtake_share_acknowledged_total")
    first.kill()
    # Its locks expire (30 s, the broker's default), then the second worker gets the rest.
    wait_delivered(kafka_broker.bootstrap, out, total, timeout=240)
    assert second.terminate() == 0, second.output()[-2000:]
    counts = ids_of(read_all(kafka_broker.bootstrap, out))
    lost, duplicated = lost_and_duplicated(total, counts)
    report("queue-sigkill", produced=total, lost=lost, duplicated=duplicated, held_at_kill=held)
    assert lost == 0
    assert duplicated <= took  # only records it had acquired (the acknowledged but unsent too)


def test_sigterm_mid_stream_duplicates_nothing(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    first, second, total, out = two_slow_workers(
        "queue-term", kafka_broker.bootstrap, topic_factory, tmp_path
    )
    assert first.terminate() == 0, first.output()[-2000:]
    wait_delivered(kafka_broker.bootstrap, out, total)
    assert second.terminate() == 0, second.output()[-2000:]
    assert_each_once("queue-sigterm", total, ids_of(read_all(kafka_broker.bootstrap, out)))


def test_poison_record_reaches_the_dlq_after_max_retries(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src, out, dlq = topic_factory(2), topic_factory(1), topic_factory(1)
    doc = queue_manifest(
        "queue-poison",
        kafka_broker.bootstrap,
        src,
        out,
        processor={"function": "support.processors:poison"},
        errors=dead_lettering(dlq, retries=2, backoff=0.05),
    )
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    values = [{"id": i, "poison": i == 7} for i in range(200)]
    produce(kafka_broker.bootstrap, src, iter(values))
    worker = WorkerProcess(path, tmp_path / "w.log").start()
    wait_delivered(kafka_broker.bootstrap, out, 199)
    deadline = time.monotonic() + 60
    while not read_all(kafka_broker.bootstrap, dlq):
        assert time.monotonic() < deadline, worker.output()[-3000:]
        time.sleep(0.5)
    assert worker.terminate() == 0, worker.output()[-2000:]
    (dead,) = read_all(kafka_broker.bootstrap, dlq)
    headers = {k: (v or b"").decode() for k, v in dead.headers() or []}
    assert headers["offtake.attempts"] == "3"  # maxRetries 2: three attempts, then the DLQ
    assert len(read_all(kafka_broker.bootstrap, out)) == 199


KINDS = ("accept", "release", "reject")


def test_poison_record_skipped_by_policy_is_rejected(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    """errors.policy: skip, no DLQ: the record is the broker's dead end, acknowledged REJECT
    (the broker takes it: no failed acknowledgement) and never delivered again."""
    src, out = topic_factory(2), topic_factory(1)
    doc = queue_manifest(
        "queue-reject",
        kafka_broker.bootstrap,
        src,
        out,
        processor={"function": "support.processors:poison"},
        errors={"policy": "skip", "maxRetries": 2, "retryBackoffSeconds": 0.05},
    )
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    produce(kafka_broker.bootstrap, src, iter({"id": i, "poison": i == 7} for i in range(200)))
    worker = WorkerProcess(path, tmp_path / "w.log").start()
    wait_delivered(kafka_broker.bootstrap, out, 199)
    worker.wait_until(lambda: worker.metric("offtake_share_acknowledged_total") == 200, "all")
    # Whether the rejected record comes back is shown by a later record, not by a wait: a
    # share partition hands out its records from the lowest one available, so a record 7
    # available again would be acquired no later than a marker written after it. One marker
    # on each partition, acknowledged: every fetch that could have brought record 7 back did.
    markers = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for partition, marker in enumerate((200, 201)):
        markers.produce(src, json.dumps({"id": marker}).encode(), partition=partition)
    assert markers.flush(30) == 0
    worker.wait_until(lambda: worker.metric("offtake_share_acknowledged_total") == 202, "markers")
    acks = {k: worker.metric("offtake_share_acknowledged_total", kind=k) for k in KINDS}
    took = acquired(worker)
    assert worker.terminate() == 0, worker.output()[-2000:]
    log = worker.output()
    report("queue-reject", acquired=took, **acks)
    assert acks == {"accept": 201, "release": 0, "reject": 1}, log[-3000:]
    assert took == 202  # one delivery each: the rejected record did not come back
    assert "acknowledging" not in log, log[-3000:]  # the broker took every acknowledgement
    assert 7 not in ids_of(read_all(kafka_broker.bootstrap, out))


def test_a_broker_without_share_groups_stops_the_worker_naming_the_field(
    topic_factory: Any, tmp_path: Path
) -> None:
    """Kafka formatted with share.version=0: the group's configuration is accepted, the
    first poll is refused (UNSUPPORTED_VERSION); the worker exits 3 naming the field."""
    with KafkaBroker(features={"share.version": 0}) as broker:
        broker.create_topic("jobs", 1)
        doc = queue_manifest("queue-none", broker.bootstrap, "jobs", "done")
        worker = WorkerProcess(write_manifest(tmp_path / "p.yaml", doc), tmp_path / "w.log")
        code = worker.start().wait(120)
    log = worker.output()
    assert code == 3, log[-3000:]
    assert "spec.source.groupType share needs Kafka 4.2 or later" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]


def test_rolling_replacement_under_a_steady_flow_loses_and_duplicates_nothing(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    """Two workers replaced one at a time (SIGTERM, then a new one), as a Deployment's rolling
    update does, while records keep arriving."""
    src, out = topic_factory(2), topic_factory(2)
    doc = queue_manifest(
        "queue-roll",
        kafka_broker.bootstrap,
        src,
        out,
        processor={"function": "support.processors:slow"},
    )
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    env = {"OFFTAKE_TEST_SLOW_SECONDS": "0.002"}
    total = 6_000
    workers = [WorkerProcess(path, tmp_path / f"w{i}.log", env).start() for i in range(2)]
    with SteadyFlow(kafka_broker.bootstrap, src, 200, 0.5, total) as flow:
        for i in range(2):
            old = workers[i]
            old.wait_until(lambda w=old: acquired(w) > 0, "records through it")
            assert old.terminate() == 0, old.output()[-2000:]
            workers.append(WorkerProcess(path, tmp_path / f"w{i + 2}.log", env).start())
        flow.join()
    wait_delivered(kafka_broker.bootstrap, out, total)
    codes = [w.terminate() for w in workers[2:]]
    assert codes == [0, 0], [w.output()[-2000:] for w in workers[2:]]
    assert_each_once("queue-rolling", total, ids_of(read_all(kafka_broker.bootstrap, out)))


def gauge(worker: WorkerProcess, name: str, **labels: str) -> float | None:
    """One gauge of a running worker's /metrics, None while it has no such series."""
    url = f"http://127.0.0.1:{worker.metrics_port()}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    found = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    ]
    return found[0] if found else None


def set_group_configs(bootstrap: str, group: str, configs: dict[str, str]) -> None:
    """Set the share group's own configs (before its first member joins)."""
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
    from confluent_kafka.admin._resource import ResourceType

    entries = [
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        for name, value in configs.items()
    ]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def produce_in_small_batches(bootstrap: str, topic: str, first: int, n: int) -> None:
    """Batches of 10: the broker hands out whole batches, so a poll stays near the group's
    share.partition.max.record.locks."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": 10})
    for i in range(first, first + n):
        p.produce(topic, json.dumps({"id": i}).encode(), key=str(i).encode())
    assert p.flush(30) == 0


def test_the_backlog_is_the_records_past_the_frontier_and_shrinks_as_workers_consume(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    """issue 39 item 3: offtake_share_backlog_messages = log end - (highest acquired + 1)."""

    src, out = topic_factory(1), topic_factory(1)
    group = f"backlog-{src}"
    # A poll of about 100 records (the broker's minimum), so the frontier stands still while
    # a slow worker works through it.
    set_group_configs(kafka_broker.bootstrap, group, {"share.partition.max.record.locks": "100"})
    doc = queue_manifest(
        "queue-backlog",
        kafka_broker.bootstrap,
        src,
        out,
        processor={"function": "support.processors:slow"},
    )
    doc["spec"]["source"]["groupId"] = group
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    produce_in_small_batches(kafka_broker.bootstrap, src, 0, 600)
    where = {"topic": src, "partition": "0"}
    slow = WorkerProcess(path, tmp_path / "slow.log", {"OFFTAKE_TEST_SLOW_SECONDS": "0.5"})
    slow.start()

    def settled() -> bool:  # a backlog measured against the frontier as it stands now
        backlog = gauge(slow, "offtake_share_backlog_messages", **where)
        frontier = gauge(slow, "offtake_share_acquired_offset", **where)
        return backlog is not None and frontier is not None and backlog == 600 - frontier - 1

    slow.wait_until(settled, "a backlog", timeout=120, every=0.2)
    frontier = gauge(slow, "offtake_share_acquired_offset", **where)
    before = gauge(slow, "offtake_share_backlog_messages", **where)
    assert frontier is not None and before is not None
    assert 300 <= before < 600, (frontier, before)  # a poll of ~100 (whole batches of 10)
    # N more records ahead: the backlog grows by N while the frontier stands (a poll of 100
    # slow records is not done in 25 s, and none is released before then).
    produce_in_small_batches(kafka_broker.bootstrap, src, 600, 300)
    slow.wait_until(
        lambda: gauge(slow, "offtake_share_backlog_messages", **where) == before + 300,
        "the backlog grown by the 300 records produced",
        timeout=20,
        every=0.2,
    )
    assert gauge(slow, "offtake_share_acquired_offset", **where) == frontier
    report("queue-backlog", frontier=frontier, backlog=before, after_300_more=before + 300)
    # What the status shows, read from this real worker: the operator's status.backlog (its
    # scrape by pod IP) and kubectl offtake status (marked as an estimate).
    running = {"metadata": {"name": "w"}, "status": {"phase": "Running", "podIP": "127.0.0.1"}}
    scraped = asyncio.run(share_backlog.read_backlog([running], slow.metrics_port()))
    assert scraped == {(src, 0): before + 300}
    url = f"http://127.0.0.1:{slow.metrics_port()}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    view = worker_metrics.Scrape()
    worker_metrics._add(view, "w", text)
    shown = status_view.queue_mode_lag(view)["backlog"]
    assert (shown["records"], shown["estimate"]) == (before + 300, True)

    # The slow worker stops (releasing its poll) and two faster ones take everything: the
    # group's backlog (the least any worker reports) shrinks to 0.
    assert slow.terminate() == 0, slow.output()[-2000:]
    fast = [
        WorkerProcess(path, tmp_path / f"fast{i}.log", {"OFFTAKE_TEST_SLOW_SECONDS": "0.01"})
        for i in range(2)
    ]
    seen = [before + 300]
    for w in fast:
        w.start()

    def group_backlog() -> float | None:
        readings = [gauge(w, "offtake_share_backlog_messages", **where) for w in fast]
        known = [r for r in readings if r is not None]
        return min(known) if known else None

    def drained() -> bool:
        backlog = group_backlog()
        if backlog is not None and backlog != seen[-1]:
            seen.append(backlog)
        return backlog == 0

    fast[0].wait_until(drained, "a backlog of 0", timeout=120, every=0.2)
    wait_delivered(kafka_broker.bootstrap, out, 900, timeout=240)
    report("queue-backlog-drain", readings=seen)
    assert seen[0] > seen[len(seen) // 2] >= seen[-1] == 0, seen
    assert all(later <= earlier for earlier, later in itertools.pairwise(seen)), seen
    assert [w.terminate() for w in fast] == [0, 0]


def test_a_poll_longer_than_the_lock_is_released_before_it_expires_not_acknowledged_late(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    """issue 39 item 5: no RENEW in confluent-kafka 2.16, so what a worker cannot finish in
    the lock it gives back before the lock runs out (another worker gets it at once) rather
    than acknowledging it after (which the broker refuses, having delivered it again)."""

    src, out = topic_factory(1), topic_factory(1)
    group = f"lock-{src}"
    # A 4 s lock (the test bed's broker allows 1 s and up), polls of ~100 records.
    set_group_configs(
        kafka_broker.bootstrap,
        group,
        {"share.record.lock.duration.ms": "4000", "share.partition.max.record.locks": "100"},
    )
    doc = queue_manifest(
        "queue-lock",
        kafka_broker.bootstrap,
        src,
        out,
        processor={"function": "support.processors:slow"},
    )
    doc["spec"]["source"]["groupId"] = group
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    produce_in_small_batches(kafka_broker.bootstrap, src, 0, 300)
    # 0.5 s a record: a poll of ~100 takes ~50 s, the lock 4 s (released after 3 s).
    worker = WorkerProcess(path, tmp_path / "w.log", {"OFFTAKE_TEST_SLOW_SECONDS": "0.5"})
    worker.start()
    worker.wait_until(
        lambda: worker.metric("offtake_share_lock_expired_total", reason="released") > 0,
        "records released before their lock ran out",
        timeout=120,
        every=0.2,
    )
    released = worker.metric("offtake_share_lock_expired_total", reason="released")
    late = worker.metric("offtake_share_lock_expired_total", reason="late")
    report("queue-lock-release", released=released, late=late)
    assert released >= 50  # most of a poll of ~100, minus the few done in 3 s
    assert late == 0
    worker.kill()
