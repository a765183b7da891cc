"""processor.concurrency on the test bed's real Kafka, calling a real local HTTP service (issue 37,
"Tests"): worker processes run ``async def`` calls to offtake_testbed.latency_service, which
answers each after a set latency and counts the calls of one key that overlap.

- order per key: 64 calls in flight over 6 partitions, 0 overlapping calls of one key at the
  service, each key's records at the sink in offset order, every record once;
- SIGTERM mid-run with calls in flight that finish within the drain timeout: the restart
  delivers the rest, 0 duplicates, 0 lost, and no record is called twice;
- SIGKILL mid-run: the restart loses nothing (duplicates allowed: what was delivered but not
  committed is delivered again; counted and printed);
- a rebalance while calls are in flight (a second worker joins): the revoked partitions' calls
  finish and commit before the other worker has them: 0 overlaps across the two, each key in
  offset order at the sink, every record once;
- exactly-once (sink.kafka.delivery exactly-once) with a SIGKILL mid-run: each record once in
  read_committed, each key in offset order;
- queue mode (source.groupType share), two workers: each record once.
"""

from __future__ import annotations

import json
import signal
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.reports import assert_each_once
from support.service_calls import LATENCY_SERVICE_ENV
from support.workers import (
    WorkerProcess,
    committed,
    committed_records,
    end_offsets,
    exactly_once_manifest,
    ids_of,
    manifest,
    produce,
    queue_manifest,
    read_all,
    wait_caught_up,
    write_manifest,
)

from offtake_operator.kubectl import status_view, worker_metrics
from offtake_testbed.kafka import KafkaBroker, read_topic
from offtake_testbed.latency_service import LatencyService

PARTITIONS = 6
CONCURRENCY = 64
DRAIN = 10  # shutdown.drainTimeoutSeconds: a call of SLOW_MS finishes well within it
IN_FLIGHT = 500  # limits.maxInFlightMessages: a stopped worker had not fetched everything
SLOW_MS = 200.0  # the latency while a worker is stopped mid-run: calls are in flight then


@pytest.fixture
def service() -> Iterator[LatencyService]:
    with LatencyService(latency_ms=20.0) as running_service:
        yield running_service


#: processor: an ``async def`` calling the service once per record, N calls in flight, key order.
PROCESSOR = {
    "function": "support.service_calls:calls_service",
    "concurrency": CONCURRENCY,
    "order": "key",
}


def _pipeline(
    name: str, kafka_broker: KafkaBroker, src: str, out: str, tmp_path: Path
) -> tuple[Path, str]:
    """An ``async def`` pipeline calling the service once per record, N calls in flight in key
    order; its manifest's path and its group."""
    doc = manifest(
        name,
        kafka_broker.bootstrap,
        [src],
        sink={"kafka": {"topic": out}},
        processor=PROCESSOR,
    )
    doc["spec"]["shutdown"] = {"drainTimeoutSeconds": DRAIN}
    # A drain lets every record handed out settle (those waiting behind a busy key too), so
    # the bound on records handed out is what leaves work in Kafka for a restart to do.
    doc["spec"]["limits"] = {"maxInFlightMessages": IN_FLIGHT}
    return write_manifest(tmp_path / f"{name}.yaml", doc), doc["spec"]["source"]["groupId"]


def _worker(path: Path, log: Path, service: LatencyService, **env: str) -> WorkerProcess:
    return WorkerProcess(path, log, env={LATENCY_SERVICE_ENV: service.url, **env}).start()


def _produce_keyed(bootstrap: str, topic: str, keys: int, total: int) -> None:
    """Records ``{"id": i, "k": "k<i % keys>"}`` keyed by ``k``: each key on one partition."""
    produce(bootstrap, topic, ({"id": i, "k": f"k{i % keys}"} for i in range(total)), key_of="k")


def _offsets_per_key(messages: list[Any]) -> dict[str, list[tuple[int, int]]]:
    """Each key's source (partition, offset) in the order its records reached the sink."""
    by_key: dict[str, list[tuple[int, int]]] = {}
    for message in messages:
        value = json.loads(message.value())
        partition, offset = value["src"]
        by_key.setdefault(value["k"], []).append((partition, offset))
    return by_key


def _assert_key_order(messages: list[Any]) -> None:
    for key, sources in _offsets_per_key(messages).items():
        assert len({partition for partition, _ in sources}) == 1, f"{key} on one partition"
        offsets = [offset for _, offset in sources]
        assert offsets == sorted(offsets), f"key {key} reached the sink out of offset order"


def _status_calls(worker: WorkerProcess) -> dict[str, Any]:
    """What ``kubectl offtake status`` shows of a running worker's calls (its /metrics, read
    here directly instead of through the API server's pod proxy)."""
    url = f"http://127.0.0.1:{worker.metrics_port()}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    scraped = worker_metrics.Scrape()
    worker_metrics._add(scraped, "w", text)
    calls = status_view.calls(PROCESSOR, scraped)
    assert calls is not None
    return calls


def _duplicates(delivered: Counter[int]) -> int:
    return sum(count - 1 for count in delivered.values())


def test_order_per_key_holds_with_64_calls_in_flight_over_6_partitions(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path, service: LatencyService
) -> None:
    keys, total = 40, 2_000
    src, out = topic_factory(PARTITIONS), topic_factory(1)
    path, group = _pipeline("order", kafka_broker, src, out, tmp_path)
    _produce_keyed(kafka_broker.bootstrap, src, keys, total)

    worker = _worker(path, tmp_path / "w.log", service)
    wait_caught_up(kafka_broker.bootstrap, group, src, PARTITIONS, timeout=180)
    assert worker.terminate() == 0, worker.output()[-3000:]

    stats = service.stats()
    assert stats.overlaps == 0, f"calls of one key overlapped: {stats}"
    assert stats.served == total, f"every record called once: {stats}"
    # Concurrency happened (else 0 overlaps would say nothing): keys were called at once.
    assert stats.keys_in_flight_max > 1, stats
    print(f"\nat most {stats.in_flight_max} calls, {stats.keys_in_flight_max} keys in flight")

    messages = read_all(kafka_broker.bootstrap, out)
    delivered = ids_of(messages)
    assert sorted(delivered) == list(range(total)) and max(delivered.values()) == 1
    _assert_key_order(messages)


def _stop_mid_run(
    how: signal.Signals,
    kafka_broker: KafkaBroker,
    topic_factory: Any,
    tmp_path: Path,
    service: LatencyService,
) -> tuple[int, Counter[int], int, int]:
    """Produce, start a worker, stop it with ``how`` once calls are in flight, restart it until
    caught up. Returns the record count, the ids delivered, the records the first worker
    delivered, and the calls the service answered over both runs."""
    keys, total = 200, 2_000  # 64 keys' calls in flight at once; about 6 s of calls in all
    src, out = topic_factory(PARTITIONS), topic_factory(1)
    path, group = _pipeline(how.name.lower(), kafka_broker, src, out, tmp_path)
    _produce_keyed(kafka_broker.bootstrap, src, keys, total)
    service.reset(latency_ms=SLOW_MS)

    first = _worker(path, tmp_path / "w1.log", service)
    first.wait_until(lambda: service.stats().served >= 300, "300 calls answered", timeout=180)
    first.wait_until(lambda: service.stats().in_flight > 0, "a call in flight", timeout=60)
    first.signal(how)
    code = first.wait(DRAIN + 30)
    if how is signal.SIGTERM:
        assert code == 0, first.output()[-3000:]
        done = committed(kafka_broker.bootstrap, group, src, PARTITIONS)
        by_first = sum(ids_of(read_all(kafka_broker.bootstrap, out)).values())
        assert by_first == sum(max(0, o) for o in done.values()), "committed what it delivered"
    by_first = sum(ids_of(read_all(kafka_broker.bootstrap, out)).values())
    assert 0 < by_first < total, f"stopped mid-run: {by_first} of {total} delivered"

    second = _worker(path, tmp_path / "w2.log", service)
    wait_caught_up(kafka_broker.bootstrap, group, src, PARTITIONS, timeout=180)
    assert second.terminate() == 0, second.output()[-3000:]
    assert committed(kafka_broker.bootstrap, group, src, PARTITIONS) == end_offsets(
        kafka_broker.bootstrap, src, PARTITIONS
    )
    delivered = ids_of(read_all(kafka_broker.bootstrap, out))
    return total, delivered, by_first, service.stats().served


def test_sigterm_mid_run_drains_the_calls_in_flight_then_the_restart_duplicates_nothing(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path, service: LatencyService
) -> None:
    total, delivered, by_first, served = _stop_mid_run(
        signal.SIGTERM, kafka_broker, topic_factory, tmp_path, service
    )
    assert sorted(delivered) == list(range(total)), "nothing lost"
    assert _duplicates(delivered) == 0, "nothing delivered twice across the restart"
    # The calls in flight at SIGTERM finished and were committed: none was made again.
    assert served == total, f"{served} calls for {total} records"
    print(f"\nfirst worker delivered {by_first} of {total}; {served} calls")


def test_sigkill_mid_run_loses_nothing_after_the_restart(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path, service: LatencyService
) -> None:
    total, delivered, by_first, served = _stop_mid_run(
        signal.SIGKILL, kafka_broker, topic_factory, tmp_path, service
    )
    assert sorted(delivered) == list(range(total)), "nothing lost"
    # Delivered but not yet committed when killed: delivered again by the restart (allowed).
    duplicates = _duplicates(delivered)
    assert duplicates <= by_first, "only what the killed worker had delivered comes again"
    print(f"\nfirst worker delivered {by_first} of {total}: {duplicates} duplicates,", end=" ")
    print(f"{served} calls")


def test_a_rebalance_with_calls_in_flight_overlaps_loses_and_duplicates_nothing(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path, service: LatencyService
) -> None:
    keys, total = 200, 3_000  # 64 keys' calls in flight at once; about 9 s of calls in all
    src, out = topic_factory(PARTITIONS), topic_factory(1)
    path, group = _pipeline("rebalance", kafka_broker, src, out, tmp_path)
    _produce_keyed(kafka_broker.bootstrap, src, keys, total)
    service.reset(latency_ms=SLOW_MS)

    first = _worker(path, tmp_path / "w1.log", service)
    first.wait_until(lambda: service.stats().served >= 300, "300 calls answered", timeout=180)
    first.wait_until(lambda: service.stats().in_flight > 0, "a call in flight", timeout=60)
    # kubectl offtake status shows them, from the worker's own gauges.
    first.wait_until(lambda: _status_calls(first)["inFlight"] > 0, "calls in its status")
    shown = _status_calls(first)
    assert 0 < shown["inFlight"] <= CONCURRENCY and shown["oldestSeconds"] is not None, shown
    second = _worker(path, tmp_path / "w2.log", service)  # joins: the first gives partitions up
    first.wait_until(lambda: "revoked" in first.output(), "the rebalance", timeout=120)
    left = total - committed_records(kafka_broker.bootstrap, group, src, PARTITIONS)
    assert left > 0, "the rebalance came before the end of the run"
    wait_caught_up(kafka_broker.bootstrap, group, src, PARTITIONS, timeout=180)
    codes = [first.terminate(), second.terminate()]
    assert codes == [0, 0], [first.output()[-3000:], second.output()[-3000:]]

    log = first.output()
    assert "revoked" in log, log[-3000:]  # the rebalance took partitions from the first
    # Its revoked partitions' calls finished within the drain and were committed.
    assert "drain budget spent" not in log, log[-3000:]
    stats = service.stats()
    assert stats.overlaps == 0, f"one key's calls overlapped across the two workers: {stats}"
    assert stats.served == total, f"every record called once: {stats}"
    messages = read_all(kafka_broker.bootstrap, out)
    assert_each_once(
        "rebalance-concurrency", total, ids_of(messages), calls=stats.served, left_at_revoke=left
    )
    pids = Counter(json.loads(m.value())["pid"] for m in messages)
    assert len(pids) == 2, f"both workers delivered records: {pids}"
    _assert_key_order(messages)


def test_exactly_once_with_concurrency_delivers_each_record_once_across_a_sigkill(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path, service: LatencyService
) -> None:
    keys, total = 200, 2_000  # 64 keys' calls in flight at once; about 6 s of calls in all
    src, out = topic_factory(PARTITIONS), topic_factory(1)
    doc = exactly_once_manifest(
        "eos",
        kafka_broker.bootstrap,
        src,
        out,
        processor=PROCESSOR,
        commit={"intervalSeconds": 0.5},
    )
    # A transaction ends once everything handed out settled: the bound makes several of them.
    doc["spec"]["limits"] = {"maxInFlightMessages": IN_FLIGHT}
    path, group = write_manifest(tmp_path / "eos.yaml", doc), doc["spec"]["source"]["groupId"]
    _produce_keyed(kafka_broker.bootstrap, src, keys, total)
    # One pod restarted: the same transactional.id, so the restart fences the killed worker
    # and aborts the transaction it left open (its calls in flight with it).
    pod = {"POD_NAME": "eos-concurrency-0"}
    service.reset(latency_ms=SLOW_MS)

    first = _worker(path, tmp_path / "w1.log", service, **pod)
    first.wait_until(
        lambda: committed_records(kafka_broker.bootstrap, group, src, PARTITIONS) > total // 4,
        "a quarter committed",
        every=0.2,
    )
    first.wait_until(lambda: service.stats().in_flight > 0, "a call in flight", timeout=60)
    first.kill()
    by_first = committed_records(kafka_broker.bootstrap, group, src, PARTITIONS)
    assert by_first < total, "killed mid-run"
    second = _worker(path, tmp_path / "w2.log", service, **pod)
    wait_caught_up(kafka_broker.bootstrap, group, src, PARTITIONS, timeout=180)
    assert second.terminate() == 0, second.output()[-3000:]

    messages = read_topic(kafka_broker.bootstrap, out, timeout=90.0, isolation="read_committed")
    in_log = len(read_topic(kafka_broker.bootstrap, out, timeout=90.0))
    counts = ids_of(messages)
    assert_each_once(
        "exactly-once-concurrency-sigkill",
        total,
        counts,
        calls=service.stats().served,
        committed_by_first=by_first,
        aborted_in_log=in_log - sum(counts.values()),
    )
    _assert_key_order(messages)


def test_queue_mode_with_concurrency_delivers_each_record_once(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path, service: LatencyService
) -> None:
    keys, total = 40, 2_000
    src, out = topic_factory(PARTITIONS), topic_factory(1)
    doc = queue_manifest("queue", kafka_broker.bootstrap, src, out, processor=PROCESSOR)
    path = write_manifest(tmp_path / "queue.yaml", doc)
    _produce_keyed(kafka_broker.bootstrap, src, keys, total)

    workers = [_worker(path, tmp_path / f"w{i}.log", service) for i in range(2)]
    workers[0].wait_until(
        lambda: len(set(ids_of(read_all(kafka_broker.bootstrap, out)))) >= total,
        "every record delivered",
        every=0.5,
    )
    codes = [w.terminate() for w in workers]
    assert codes == [0, 0], [w.output()[-2000:] for w in workers]
    stats = service.stats()
    assert_each_once(
        "queue-concurrency",
        total,
        ids_of(read_all(kafka_broker.bootstrap, out)),
        calls=stats.served,
        in_flight_max=stats.in_flight_max,
    )
    assert stats.in_flight_max > 1, stats
