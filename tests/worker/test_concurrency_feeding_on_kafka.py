"""processor.concurrency with lanes on many partitions: every partition's keys get calls.

librdkafka hands out a poll's records a partition at a time. Without a share of the in-flight
bound per partition, the bound filled with the first partitions' records, which wait behind
their few busy keys, and the other partitions' keys got no call until those drained (the
bench's 10 keys on 12 partitions: 2 calls in flight of 64). The worker stops fetching a
partition that holds its share (PartitionPauser.share) and resumes it from its last record.
"""

from __future__ import annotations

import time
from typing import Any

from support import processors
from support.workers import manifest, produce, running

from offtake.config import parse_pipeline
from offtake.engine.assembly import build_worker
from offtake_testbed.kafka import KafkaBroker

KEYS = 10
PER_KEY = 2_000
# limits.maxInFlightMessages' default, 10,000: half the input. Over 12 partitions a share is
# 833 records; a poll takes at most 500, and pausing is asynchronous, so the first partition
# fetched may hand out a few polls before its pause holds.
EARLY = 2_500  # calls by which every key must have had one (without shares: about 5 keys)


def test_every_key_gets_calls_before_the_first_partitions_drain(
    kafka_broker: KafkaBroker, topic_factory: Any
) -> None:
    src, out = topic_factory(12), topic_factory(1)
    doc = manifest(
        "feeding",
        kafka_broker.bootstrap,
        [src],
        sink={"kafka": {"topic": out}},
        processor={"function": "support.processors:waits", "concurrency": 64, "order": "key"},
    )
    # Keys k0..k9, each on its partition (by the key's hash), PER_KEY records each.
    produce(
        kafka_broker.bootstrap,
        src,
        ({"id": i, "k": f"k{i % KEYS}"} for i in range(KEYS * PER_KEY)),
        key_of="k",
    )
    processors.WAITING_CALLS.clear()
    processors.WAITING_OVERLAPS.clear()
    worker = build_worker(parse_pipeline(doc))
    with running(worker) as runner:
        deadline = time.monotonic() + 120
        while len(processors.WAITING_CALLS) < EARLY:
            assert time.monotonic() < deadline, "the worker made no calls"
            assert runner.is_alive(), "the worker stopped"
            time.sleep(0.05)
    calls = list(processors.WAITING_CALLS)
    first = calls[:EARLY]
    # Every key had a call early: none waited for other partitions' records to drain (without
    # shares, the first 10,000 calls went to the keys of the first partitions fetched).
    assert {key for key, _, _ in first} == {f"k{i}".encode() for i in range(KEYS)}
    # Order per key held throughout, across pauses and resumes: offsets ascend, once each.
    by_key: dict[bytes | None, list[int]] = {}
    for key, _, offset in calls:
        by_key.setdefault(key, []).append(offset)
    for key, offsets in by_key.items():
        assert offsets == sorted(set(offsets)), f"key {key!r} out of order or repeated"
    assert processors.WAITING_OVERLAPS == []
