"""A sink that stalls for 30 s: the worker pauses, stays in its group, stays bounded, resumes."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from support.workers import manifest, produce, running

from offtake.config import parse_pipeline
from offtake.engine.assembly import build_worker
from offtake.records import TopicPartition
from offtake.sinks.base import Sink, SinkBatch
from offtake_testbed.kafka import KafkaBroker

STALL_SECONDS = 30.0


class StallingSink(Sink):
    """Settles batches at once, except during a stall window, when it holds them all."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[SinkBatch] = []
        self.seen: list[int] = []
        self.lock = threading.Lock()
        self.stall_until = 0.0

    def stall(self, seconds: float) -> None:
        self.stall_until = time.monotonic() + seconds

    @property
    def stalled(self) -> bool:
        return time.monotonic() < self.stall_until

    def submit(self, batch: SinkBatch) -> None:
        with self.lock:
            self.seen.extend(item.record.value["id"] for item in batch.items)
            if self.stalled:
                self.held.append(batch)
                return
        self.settle(batch)

    def poll(self) -> None:
        if not self.stalled:
            with self.lock:
                held, self.held = self.held, []
            for batch in held:
                self.settle(batch)

    def drain(self, partitions: Collection[TopicPartition] | None, timeout: float) -> bool:
        self.poll()
        return not self.held


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_stalled_sink_pauses_partitions_without_rebalance_and_resumes(
    kafka_broker: KafkaBroker, topic_factory: Any
) -> None:
    src = topic_factory(6)
    limit = 1000
    doc = manifest(
        "stall",
        kafka_broker.bootstrap,
        [src],
        sink={"log": {}},
        limits={"maxInFlightMessages": limit},
    )
    # A worker that stopped polling for 30 s would be expelled after 10 s: staying in the
    # group proves it kept polling while paused.
    doc["spec"]["kafka"]["config"]["max.poll.interval.ms"] = "10000"
    total = produce(
        kafka_broker.bootstrap, src, ({"id": i, "pad": "x" * 200} for i in range(60_000))
    )
    sink = StallingSink()
    worker = build_worker(parse_pipeline(doc), sink=sink)
    with running(worker):
        deadline = time.monotonic() + 60
        while len(sink.seen) < 5_000:
            assert time.monotonic() < deadline, "the worker never got going"
            time.sleep(0.05)
        assigned_before = worker.metrics.assigned_partitions._value.get()
        rss_before = rss_bytes()
        sink.stall(STALL_SECONDS)
        samples: list[dict[str, float]] = []
        while sink.stalled:
            samples.append(
                {
                    "inflight": worker.tracker.inflight_messages,
                    "paused": worker.metrics.paused_partitions._value.get(),
                    "assigned": worker.metrics.assigned_partitions._value.get(),
                    "heartbeat_age": worker.health.seconds_since_heartbeat(),
                    "rss": rss_bytes(),
                }
            )
            time.sleep(0.5)
        late = [s for s in samples[4:]]  # after the first two seconds of the stall
        assert late and all(s["paused"] == s["assigned"] == assigned_before == 6 for s in late), (
            samples[:8]
        )
        # Bounded: at most one poll's worth above the limit (a poll may return before a pause).
        assert max(s["inflight"] for s in samples) <= limit + 500
        assert max(s["heartbeat_age"] for s in samples) < 2.0
        rss_growth = max(s["rss"] for s in samples) - rss_before
        assert rss_growth < 100 * 2**20, (
            f"memory grew by {rss_growth / 2**20:.0f} MiB during the stall"
        )
        revokes = worker.metrics.rebalances.labels("revoke")._value.get()
        lost = worker.metrics.rebalances.labels("lost")._value.get()
        assert (revokes, lost) == (0, 0), "the stall must not cost the worker its partitions"
        deadline = time.monotonic() + 120
        while len(set(sink.seen)) < total:
            assert time.monotonic() < deadline, f"did not resume: {len(set(sink.seen))}/{total}"
            time.sleep(0.2)
        print(
            "\nREPORT "
            + json.dumps(
                {
                    "test": "stall",
                    "stall_seconds": STALL_SECONDS,
                    "max_inflight": max(s["inflight"] for s in samples),
                    "limit": limit,
                    "rss_growth_mib": round(rss_growth / 2**20, 1),
                    "revokes": revokes,
                    "max_heartbeat_age": round(max(s["heartbeat_age"] for s in samples), 2),
                }
            )
        )
    assert sorted(set(sink.seen)) == list(range(total))


def test_partitions_gained_during_backpressure_are_paused_before_their_first_fetch(
    kafka_broker: KafkaBroker, topic_factory: Any
) -> None:
    src = topic_factory(6)
    limit = 200
    doc = manifest(
        "gain",
        kafka_broker.bootstrap,
        [src],
        sink={"log": {}},
        limits={"maxInFlightMessages": limit},
        shutdown={"drainTimeoutSeconds": 1},
    )
    produce(kafka_broker.bootstrap, src, ({"id": i} for i in range(6_000)))
    sinks = [StallingSink(), StallingSink()]
    for sink in sinks:
        sink.stall(3600)  # both hang from the start: each fills up to its bound and pauses
    workers = [build_worker(parse_pipeline(doc), sink=sink) for sink in sinks]
    runners = [threading.Thread(target=w.run) for w in workers]
    runners[0].start()
    deadline = time.monotonic() + 60
    while workers[0].metrics.assigned_partitions._value.get() != 6:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    runners[1].start()
    while not (
        workers[0].backpressure.engaged
        and workers[1].backpressure.engaged
        and workers[1].metrics.assigned_partitions._value.get() > 0
    ):
        assert time.monotonic() < deadline, "both workers should fill up and pause"
        time.sleep(0.1)
    gained_from = workers[1].metrics.assigned_partitions._value.get()
    workers[1].stop()  # its partitions move to worker 0, which is at its bound
    runners[1].join(30)
    worst = 0
    until = time.monotonic() + 8
    while time.monotonic() < until:
        worst = max(worst, workers[0].tracker.inflight_messages)
        time.sleep(0.02)
    assert workers[0].metrics.assigned_partitions._value.get() == 6
    assert workers[0].metrics.paused_partitions._value.get() == 6
    sinks[0].stall_until = 0.0  # release: everything flows again
    deadline = time.monotonic() + 60
    while len(set(sinks[0].seen) | set(sinks[1].seen)) < 6_000:
        assert time.monotonic() < deadline, "did not resume after the stall"
        time.sleep(0.1)
    workers[0].stop()
    runners[0].join(30)
    print(
        f'\nREPORT {{"test": "gain-during-backpressure", "gained": {6 - gained_from}, '
        f'"worst_inflight": {worst}, "limit": {limit}}}'
    )
    assert worst <= limit
