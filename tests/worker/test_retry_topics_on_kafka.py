"""Retry topics (errors.retryTopics) on a real broker, with real worker processes.

A record that fails twice and then succeeds goes to ``<topic>.retry-2s``, then to
``<topic>.retry-7s``, and is delivered on its third attempt; each attempt comes when its delay
has passed (within a second) while the records behind it on its partition flow on, and the
worker stays in its group although the longer delay exceeds ``max.poll.interval.ms``. A record
that always fails ends in the dead-letter topic after the last retry topic, its headers naming
where it came from. The measured delays are reported (``$OFFTAKE_REPORT``).

In-place retries and errors.ordering: by default the records behind a retried one overtake
it; with ``strict`` its partition keeps its order while the other partition flows on.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.reports import report
from support.workers import (
    WorkerProcess,
    committed,
    end_offsets,
    manifest,
    produce,
    read_all,
    wait_caught_up,
    write_manifest,
)

from offtake_testbed.kafka import KafkaBroker

DELAYS = (2, 7)  # the second is longer than max.poll.interval.ms (6 s) and the session timeout
FLAKY, POISON = 10, 20


@pytest.fixture
def retry_topics(kafka_broker: KafkaBroker) -> Iterator[Callable[[str], list[str]]]:
    """The broker does not create topics on its own (nor does the worker): create them."""
    made: list[str] = []

    def make(source: str) -> list[str]:
        for delay in DELAYS:
            name = f"{source}.retry-{delay}s"
            kafka_broker.create_topic(name, 2)
            made.append(name)
        return made

    yield make
    for name in made:
        kafka_broker.delete_topic(name, missing_ok=True)


@pytest.mark.parametrize("delivery", ["at-least-once", "exactly-once"])
def test_a_record_failing_twice_waits_on_retry_topics_without_holding_back_the_others(
    delivery: str,
    kafka_broker: KafkaBroker,
    topic_factory: Any,
    retry_topics: Callable[[str], list[str]],
    tmp_path: Path,
) -> None:
    src, out, dlq = topic_factory(1), topic_factory(1), topic_factory(1)
    retry_2s, retry_7s = retry_topics(src)
    doc = manifest(
        f"retry-{delivery}",
        kafka_broker.bootstrap,
        [src],
        sink={"kafka": {"topic": out, "delivery": delivery}},
        processor={"function": "support.processors:fails_twice"},
        errors={
            "policy": "dlq",
            "dlq": {"topic": dlq},
            "maxRetries": 0,  # no in-place retries: straight to the retry topics
            "retryTopics": [{"delaySeconds": d} for d in DELAYS],
        },
    )
    doc["spec"]["kafka"]["config"]["max.poll.interval.ms"] = "6000"
    group = doc["spec"]["source"]["groupId"]
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    attempts_file = tmp_path / "attempts"
    attempts_file.touch()
    produce(
        kafka_broker.bootstrap,
        src,
        ({"id": i, "flaky": i == FLAKY, "poison": i == POISON} for i in range(100)),
    )
    worker = WorkerProcess(
        path, tmp_path / "w.log", env={"OFFTAKE_TEST_ATTEMPTS_FILE": str(attempts_file)}
    ).start()

    def attempts(record_id: int) -> list[tuple[str, float]]:
        return [
            (topic, float(at))
            for rid, topic, at in (line.split() for line in attempts_file.read_text().splitlines())
            if int(rid) == record_id
        ]

    worker.wait_until(lambda: len(attempts(FLAKY)) >= 1, "the first attempt", timeout=120)
    # While the flaky record waits for its retry, more records arrive on the same partition
    # behind it, one every 50 ms: each must be processed at once.
    later: dict[int, float] = {}

    def trickle() -> None:
        for i in range(100, 140):
            later[i] = time.time()
            produce(kafka_broker.bootstrap, src, [{"id": i}])
            time.sleep(0.05)

    flow = threading.Thread(target=trickle)
    flow.start()
    worker.wait_until(lambda: len(attempts(FLAKY)) >= 3, "the third attempt", timeout=60)
    flow.join()
    worker.wait_until(lambda: len(attempts(POISON)) >= 3, "the poison's last attempt", timeout=30)
    wait_caught_up(kafka_broker.bootstrap, group, src, 1, timeout=60)
    worker.wait_until(
        lambda: len(read_all(kafka_broker.bootstrap, out)) >= 139, "all outputs", every=0.5
    )
    assert worker.terminate() == 0, worker.output()[-3000:]
    # The retry topics' offsets were committed too: the sends settled their records. (A
    # transaction's commit marker takes an offset of its own past the last record.)
    marker = 1 if delivery == "exactly-once" else 0
    for topic in (retry_2s, retry_7s):
        ends = end_offsets(kafka_broker.bootstrap, topic, 2)
        done = committed(kafka_broker.bootstrap, group, topic, 2)
        assert all(done[p] >= ends[p] - marker for p in ends if ends[p] > 0), (topic, done, ends)

    tries = attempts(FLAKY)
    assert [t for t, _ in tries] == [src, retry_2s, retry_7s]
    waited = [b - a for (_, a), (_, b) in itertools.pairwise(tries)]
    for delay, took in zip(DELAYS, waited, strict=True):
        assert delay <= took < delay + 1.0, f"waited {took:.3f}s for a {delay}s retry"

    outputs = {
        m["id"]: m for m in (json.loads(r.value()) for r in read_all(kafka_broker.bootstrap, out))
    }
    assert sorted(outputs) == [i for i in range(140) if i != POISON]
    first_try, first_retry = tries[0][1], tries[1][1]
    # Not held back: every record behind the flaky one in the first batch was done before its
    # first retry was even due, and those produced while it waited within a fraction of a
    # second each.
    behind = [i for i in range(FLAKY + 1, 100) if i != POISON]
    assert max(outputs[i]["at"] for i in behind) < first_try + DELAYS[0]
    latencies = [outputs[i]["at"] - later[i] for i in range(100, 140)]
    assert max(latencies) < 1.0, latencies
    during_wait = [i for i in range(100, 140) if first_try < outputs[i]["at"] < first_retry]
    assert len(during_wait) >= 10, during_wait
    assert outputs[FLAKY]["at"] == pytest.approx(tries[2][1], abs=0.01)

    # The retry topics' records say where they came from, how often they failed and why.
    first_hop = {json.loads(m.value())["id"]: m for m in read_all(kafka_broker.bootstrap, retry_2s)}
    assert sorted(first_hop) == [FLAKY, POISON]
    msg = first_hop[FLAKY]
    headers = {k: v.decode() for k, v in msg.headers()}
    assert msg.key() == str(FLAKY).encode()
    assert headers["offtake.original.topic"] == src
    assert headers["offtake.original.partition"] == "0"
    assert headers["offtake.original.offset"] == str(FLAKY)
    assert headers["offtake.attempts"] == "1"
    assert headers["offtake.error.class"] == "builtins.ValueError"
    assert "failed on attempt 1" in headers["offtake.error.message"]
    assert headers["offtake.retry.topic"] == retry_2s
    # Due = the send time + the topic's delay, and the record is stamped with that send time.
    # One CI run (exactly-once, loaded) read the record's timestamp 1 ms after the header's send
    # time, not reproduced in 12 runs under load since; the worker's rule does not depend on
    # it (RetryRoute.due_ms caps the header at timestamp + delay), so a ms either way is
    # accepted and the records are shown if it is ever more.
    skew = int(headers["offtake.retry.due"]) - (msg.timestamp()[1] + DELAYS[0] * 1000)
    assert abs(skew) <= 1, [
        (m.offset(), m.timestamp(), m.headers()) for m in read_all(kafka_broker.bootstrap, retry_2s)
    ]

    # After the last retry topic, the policy: the poison record is a dead letter.
    (dead,) = read_all(kafka_broker.bootstrap, dlq)
    headers = {k: v.decode() for k, v in dead.headers()}
    assert json.loads(dead.value())["id"] == POISON
    assert headers["offtake.original.topic"] == src
    assert headers["offtake.original.offset"] == str(POISON)
    assert headers["offtake.attempts"] == "3"
    assert "failed on attempt 3" in headers["offtake.error.message"]
    assert not any(k.startswith("offtake.retry.") for k in headers)
    assert [t for t, _ in attempts(POISON)] == [src, retry_2s, retry_7s]

    log = worker.output().split("shutting down")[0]  # closing revokes, as it should
    assert "revoked " not in log and "without a clean revoke" not in log, "it left its group"
    report(
        f"retry-topics-{delivery}",
        delays=list(DELAYS),
        waited=[round(w, 3) for w in waited],
        late_by=[round(w - d, 3) for w, d in zip(waited, DELAYS, strict=True)],
        others_max_latency_s=round(max(latencies), 3),
        others_processed_during_first_wait=len(during_wait),
    )


def test_missing_retry_topics_are_named_and_the_worker_exits_3(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src = topic_factory(1)
    kafka_broker.create_topic(f"{src}.retry-5s", 1)
    try:
        doc = manifest(
            "retry-missing",
            kafka_broker.bootstrap,
            [src],
            sink={"log": {}},
            errors={"policy": "skip", "retryTopics": [{"delaySeconds": 5}, {"delaySeconds": 30}]},
        )
        worker = WorkerProcess(write_manifest(tmp_path / "p.yaml", doc), tmp_path / "w.log")
        assert worker.start().wait(60) == 3
        text = worker.output()
        assert f"retry topic(s) {src}.retry-30s of spec.errors.retryTopics do not exist" in text
        assert "Traceback" not in text
    finally:
        kafka_broker.delete_topic(f"{src}.retry-5s", missing_ok=True)


@pytest.mark.parametrize("ordering", ["relaxed", "strict"])
def test_in_place_retries_keep_partition_order_only_when_strict(
    ordering: str, kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    src, out = topic_factory(2), topic_factory(1)  # one output partition: the sink's order
    doc = manifest(
        f"order-{ordering}",
        kafka_broker.bootstrap,
        [src],
        sink={"kafka": {"topic": out}},
        processor={"function": "support.processors:fails_twice"},
        errors={
            "policy": "stop",
            "maxRetries": 3,
            "retryBackoffSeconds": 0.3,
            "ordering": ordering,
        },
    )
    group = doc["spec"]["source"]["groupId"]
    attempts_file = tmp_path / "attempts"
    attempts_file.touch()
    produce(kafka_broker.bootstrap, src, ({"id": i, "flaky": i == FLAKY} for i in range(60)))
    partition_of = {
        json.loads(m.value())["id"]: m.partition() for m in read_all(kafka_broker.bootstrap, src)
    }
    worker = WorkerProcess(
        write_manifest(tmp_path / "p.yaml", doc),
        tmp_path / "w.log",
        env={"OFFTAKE_TEST_ATTEMPTS_FILE": str(attempts_file)},
    ).start()
    wait_caught_up(kafka_broker.bootstrap, group, src, 2, timeout=60)
    assert worker.terminate() == 0, worker.output()[-3000:]
    order = [json.loads(m.value())["id"] for m in read_all(kafka_broker.bootstrap, out)]
    assert sorted(order) == list(range(60))
    mine = partition_of[FLAKY]
    same = [i for i in order if partition_of[i] == mine]
    other = [i for i in order if partition_of[i] != mine]
    assert other == sorted(other) and other  # never held, never reordered
    if ordering == "strict":
        assert same == sorted(same)  # the records behind it waited 0.3 + 0.6 s for it
        assert order.index(max(other)) < order.index(FLAKY)  # only its partition waited
    else:
        assert same != sorted(same) and same[-1] == FLAKY  # overtaken by all behind it
    overtaken_by = [i for i in same[: same.index(FLAKY)] if i > FLAKY]
    report(f"ordering-{ordering}", order_kept=same == sorted(same), overtaken_by=len(overtaken_by))
