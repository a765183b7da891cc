"""errors.retryTopics on the real engine with the in-memory broker: the route a failing record
takes, its headers and its delays (on a real broker: tests/worker/test_retry_topics_on_kafka.py).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from test_testing import manifest

from offtake.records import Record
from offtake.testing import MemoryBroker, headers_of, run_pipeline


class Flaky:
    """Fails id 3 twice and id 5 always; notes when and from which topic each attempt came."""

    def __init__(self) -> None:
        self.tries: dict[int, list[tuple[str, float]]] = {}
        self._lock = threading.Lock()

    def __call__(self, record: Record) -> Any:
        rid = record.value["id"]
        with self._lock:
            tries = self.tries.setdefault(rid, [])
            tries.append((record.topic, time.time()))
            n = len(tries)
        if rid == 5 or (rid == 3 and n <= 2):
            raise ValueError(f"attempt {n} at {rid}")
        return {**record.value, "at": time.time()}


def test_a_failing_record_goes_through_each_retry_topic_after_its_delay_then_the_dlq() -> None:
    broker = MemoryBroker()
    broker.create_topic("orders", 1)
    for i in range(10):
        broker.produce("orders", {"id": i}, key=str(i), headers=[("trace", b"t-%d" % i)])
    errors = {
        "policy": "dlq",
        "dlq": {"topic": "orders.dlq"},
        "maxRetries": 1,
        "retryBackoffSeconds": 0.05,
        "retryTopics": [{"delaySeconds": 1}, {"delaySeconds": 2}],
    }
    flaky = Flaky()
    run = run_pipeline(manifest(errors=errors), broker, processor=flaky, partitions=1)
    assert run.ok, run
    # In place first (maxRetries 1), then each retry topic, in place again on each.
    topics = [t for t, _ in flaky.tries[3]]
    assert topics == ["orders", "orders", "orders.retry-1s"]
    assert [t for t, _ in flaky.tries[5]] == [
        "orders",
        "orders",
        "orders.retry-1s",
        "orders.retry-1s",
        "orders.retry-2s",
        "orders.retry-2s",
    ]
    times = [at for _, at in flaky.tries[5]]
    assert 1.0 <= times[2] - times[1] < 1.5
    assert 2.0 <= times[4] - times[3] < 2.5
    # Not held back: the others were done before record 3's first retry was due.
    outputs = {o["id"]: o for o in run.outputs}
    assert sorted(outputs) == [i for i in range(10) if i != 5]
    assert max(outputs[i]["at"] for i in range(4, 10) if i != 5) < flaky.tries[3][1][1] + 1.0

    first_hop = broker.records("orders.retry-1s")
    assert [m.key() for m in first_hop] == [b"3", b"5"]
    h = headers_of(first_hop[0])
    assert h["trace"] == "t-3"
    assert (h["offtake.original.topic"], h["offtake.original.offset"]) == ("orders", "3")
    assert h["offtake.attempts"] == "2"
    assert h["offtake.error.message"] == "ValueError: attempt 2 at 3"
    assert h["offtake.retry.topic"] == "orders.retry-1s"
    due = int(h["offtake.retry.due"] or 0)
    assert due == first_hop[0].timestamp()[1] + 1000

    (dead,) = run.dlq
    h = headers_of(dead)
    assert dead.key() == b"5" and h["trace"] == "t-5"
    assert (h["offtake.original.topic"], h["offtake.original.offset"]) == ("orders", "5")
    assert h["offtake.attempts"] == "6"
    assert "offtake.retry.due" not in h
    names = [k for k, _ in dead.headers() or []]
    assert len(names) == len(set(names)), names  # each header once, not one per hop
