"""processor.concurrency on the real engine with the in-memory broker: property tests.

Random keys over random partitions, records that fail once (retried after a backoff), fail
for good (dead-lettered), ask to slow down (offtake.Backpressure) or are dropped, async and
threaded functions, one worker or two (a rebalance mid-run). Whatever the draw:

- two calls of one lane (key: partition and key; partition: partition) never overlap;
- each lane's records reach the sink in offset order, each once;
- while a call runs, its partition's committed offset has not passed its record (the commit
  never passes an unsettled record);
- everything is committed at the end, the dead letters are exactly the records that failed
  for good.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_testing import manifest

from offtake import Backpressure
from offtake.records import Record
from offtake.testing import MemoryBroker, headers_of, run_pipeline

FATES = ("ok", "ok", "ok", "fail_once", "fail_always", "slow_down_once", "drop")
GROUP = "g"


@dataclass
class Watch:
    """What the function saw: lanes in flight, overlaps, commits past a running record."""

    order: str
    broker: MemoryBroker
    fates: dict[tuple[int, int], str]
    lock: threading.Lock = field(default_factory=threading.Lock)
    active: dict[object, int] = field(default_factory=lambda: defaultdict(int))
    attempts: dict[tuple[int, int], int] = field(default_factory=lambda: defaultdict(int))
    overlaps: list[object] = field(default_factory=list)
    passed: list[tuple[int, int, int]] = field(default_factory=list)
    most: int = 0

    def lane(self, r: Record) -> object:
        return (r.partition, r.key) if self.order == "key" else r.partition

    def enter(self, r: Record) -> str:
        with self.lock:
            lane = self.lane(r)
            if self.order != "none" and self.active[lane]:
                self.overlaps.append(lane)
            self.active[lane] += 1
            self.most = max(self.most, sum(self.active.values()))
            self.attempts[(r.partition, r.offset)] += 1
            return self.fates[(r.partition, r.offset)]

    def leave(self, r: Record, fate: str) -> Any:
        committed = self.broker.committed(GROUP, r.topic, r.partition)
        with self.lock:
            if committed is not None and committed > r.offset:
                self.passed.append((r.partition, r.offset, committed))
            self.active[self.lane(r)] -= 1
            n = self.attempts[(r.partition, r.offset)]
        if fate == "fail_always" or (fate == "fail_once" and n == 1):
            raise ValueError(f"{fate} at {r.where()} (attempt {n})")
        if fate == "slow_down_once" and n == 1:
            raise Backpressure(0.05)
        if fate == "drop":
            return None
        return r.value


def make_function(watch: Watch, kind: str) -> Any:
    if kind == "async":

        async def handle(record: Record) -> Any:
            fate = watch.enter(record)
            await asyncio.sleep(0.002 * (record.offset % 3))
            return watch.leave(record, fate)

        return handle

    def handle_sync(record: Record) -> Any:
        fate = watch.enter(record)
        time.sleep(0.002 * (record.offset % 3))
        return watch.leave(record, fate)

    return handle_sync


records_strategy = st.lists(
    st.tuples(
        st.integers(0, 2), st.sampled_from([None, "a", "b", "c", "d"]), st.sampled_from(FATES)
    ),
    min_size=1,
    max_size=60,
)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    order=st.sampled_from(["key", "partition", "none"]),
    kind=st.sampled_from(["async", "threads"]),
    concurrency=st.sampled_from([2, 8, 64]),
    workers=st.sampled_from([1, 1, 2]),
    records=records_strategy,
)
def test_lanes_order_and_the_commit_watermark_hold(
    order: str,
    kind: str,
    concurrency: int,
    workers: int,
    records: list[tuple[int, str | None, str]],
) -> None:
    broker = MemoryBroker()
    broker.create_topic("orders", 3)
    fates: dict[tuple[int, int], str] = {}
    next_offset: dict[int, int] = defaultdict(int)
    sent: dict[tuple[int, int], tuple[str | None, str]] = {}
    for partition, key, fate in records:
        offset = next_offset[partition]
        next_offset[partition] += 1
        fates[(partition, offset)] = fate
        sent[(partition, offset)] = (key, fate)
        broker.produce("orders", {"p": partition, "o": offset}, key=key, partition=partition)
    watch = Watch(order, broker, fates)
    doc = manifest(
        processor={"function": "x:y", "concurrency": concurrency, "order": order},
        errors={
            "policy": "dlq",
            "dlq": {"topic": "orders-dlq"},
            "maxRetries": 1,
            "retryBackoffSeconds": 0.02,
        },
    )
    result = run_pipeline(
        doc, broker, processor=make_function(watch, kind), workers=workers, timeout=60
    )
    assert result.ok, result
    assert watch.overlaps == []
    assert watch.passed == []
    assert watch.most <= concurrency * workers
    delivered = [(o["p"], o["o"]) for o in result.outputs]
    expected = {k for k, (_, fate) in sent.items() if fate not in ("fail_always", "drop")}
    assert len(delivered) == len(set(delivered)) and set(delivered) == expected
    if order != "none":
        by_lane: dict[object, list[int]] = defaultdict(list)
        for partition, offset in delivered:
            key = sent[(partition, offset)][0]
            by_lane[(partition, key) if order == "key" else partition].append(offset)
        for offsets in by_lane.values():
            assert offsets == sorted(offsets)
    dead = []
    for message in result.dlq:
        h = headers_of(message)
        dead.append(
            (int(h["offtake.original.partition"] or -1), int(h["offtake.original.offset"] or -1))
        )
    assert sorted(dead) == sorted(k for k, (_, fate) in sent.items() if fate == "fail_always")


def test_async_def_at_concurrency_1_is_awaited_one_at_a_time() -> None:
    """No concurrency set: an async def still works, a coroutine is never sent as a value."""
    broker = MemoryBroker()
    broker.create_topic("orders", 1)
    for i in range(20):
        broker.produce("orders", {"id": i}, key=str(i % 3))
    running = [0]
    most = [0]

    async def handle(record: Record) -> Any:
        running[0] += 1
        most[0] = max(most[0], running[0])
        await asyncio.sleep(0)
        running[0] -= 1
        return {**record.value, "seen": True}

    result = run_pipeline(manifest(processor={"function": "x:y"}), broker, processor=handle)
    assert result.ok, result
    assert [o["id"] for o in result.outputs] == list(range(20))
    assert all(o["seen"] for o in result.outputs) and most[0] == 1


def test_a_plain_function_returning_a_coroutine_is_awaited() -> None:
    broker = MemoryBroker()
    broker.create_topic("orders", 1)
    broker.produce("orders", {"id": 1})

    async def enrich(value: Any) -> Any:
        return {**value, "enriched": True}

    def handle(record: Record) -> Any:
        return enrich(record.value)

    result = run_pipeline(manifest(processor={"function": "x:y"}), broker, processor=handle)
    assert result.ok, result
    assert result.outputs == [{"id": 1, "enriched": True}]


def test_one_hot_key_runs_one_at_a_time_and_does_not_starve_other_partitions() -> None:
    broker = MemoryBroker()
    broker.create_topic("orders", 2)
    for i in range(100):
        broker.produce("orders", {"id": i, "hot": True}, key="hot", partition=0)
    for i in range(100):
        broker.produce("orders", {"id": 1000 + i, "hot": False}, key=str(i), partition=1)
    watch = Watch("key", broker, defaultdict(lambda: "ok"))
    order: list[int] = []

    async def handle(record: Record) -> Any:
        fate = watch.enter(record)
        await asyncio.sleep(0.001)
        order.append(record.value["id"])
        return watch.leave(record, fate)

    doc = manifest(processor={"function": "x:y", "concurrency": 32})
    result = run_pipeline(doc, broker, processor=handle)
    assert result.ok, result
    assert watch.overlaps == []
    hot = [i for i in order if i < 1000]
    assert hot == list(range(100))
    # The other partition's records ran beside the hot key: all of them were done before the
    # hot key's last record was, though both partitions were handed over together.
    assert order.index(1099) < order.index(99)
