"""The offset tracker: commit positions when work finishes out of order."""

from __future__ import annotations

from offtake.config.spec import LimitsSpec
from offtake.engine.backpressure import InFlightGate
from offtake.engine.offsets import OffsetTracker
from offtake.records import TopicPartition

TP = TopicPartition("t", 0)


def tracker_with(offsets: range) -> tuple[OffsetTracker, int]:
    t = OffsetTracker()
    epoch = t.assign(TP)
    for o in offsets:
        t.register_batch(TP, [o], 100, 1_000 + o)  # a chunk per record
    return t, epoch


def test_position_is_the_lowest_pending_offset() -> None:
    t, e = tracker_with(range(10, 15))
    assert t.position(TP) == 10
    for o in (11, 12, 14):
        t.settle(TP, o, e)
    assert t.position(TP) == 10  # 10 still pending: nothing above it may be committed
    t.settle(TP, 10, e)
    assert t.position(TP) == 13
    t.settle(TP, 13, e)
    assert t.position(TP) == 15  # all done: one past the last consumed


def test_records_stay_in_flight_until_a_commit_past_them_is_acknowledged() -> None:
    t, e = tracker_with(range(5))
    for o in range(5):
        t.settle(TP, o, e)
    assert (t.inflight_messages, t.inflight_bytes) == (5, 500)
    assert t.settled_uncommitted() == 5
    assert t.commit_positions() == {TP: 5}
    t.committed(TP, 3)
    assert (t.inflight_messages, t.inflight_bytes) == (2, 200)
    t.committed(TP, 5)
    assert t.inflight_messages == 0 and t.commit_positions() == {}


def test_a_failed_record_caps_the_position_forever() -> None:
    t, e = tracker_with(range(5))
    t.fail(TP, 2, e)
    for o in (0, 1, 3, 4):
        t.settle(TP, o, e)
    assert t.position(TP) == 2
    assert t.pending_in(None) == 0  # settled, so drains do not wait for it


def test_stale_settlements_after_reassignment_are_ignored() -> None:
    t, old = tracker_with(range(3))
    new = t.assign(TP)  # revoked and assigned again: in-flight work of `old` is stale
    assert t.inflight_messages == 0
    assert t.settle(TP, 0, old) is False
    t.register_batch(TP, [7], 10, None)
    assert t.settle(TP, 7, new) is True
    assert t.position(TP) == 8


def test_a_renewed_partition_keeps_its_commit_and_makes_old_work_stale() -> None:
    t, old = tracker_with(range(5))
    t.settle(TP, 0, old)
    t.committed(TP, 1)
    new = t.renew(TP)  # an exactly-once rewind, a share group's poll given back
    assert new != old and t.epoch(TP) == new
    assert t.inflight_messages == 0 and t.inflight_bytes == 0
    assert t.last_committed(TP) == 1
    assert t.settle(TP, 1, old) is False


def test_acknowledged_records_leave_in_flight_without_a_commit_position() -> None:
    t, e = tracker_with(range(3))
    for o in range(3):
        t.settle(TP, o, e)
    t.acknowledged(TP)  # queue mode: each was acknowledged to the share group
    assert (t.inflight_messages, t.inflight_bytes) == (0, 0)
    assert t.last_committed(TP) is None and t.epoch(TP) == e
    t.register_batch(TP, [9], 10, None)  # the next poll, same epoch
    assert t.settle(TP, 9, e) is True and t.pending_in(None) == 0


def test_oldest_uncommitted_timestamp_drives_lag_seconds() -> None:
    t, e = tracker_with(range(3))
    assert t.oldest_uncommitted_timestamp(TP) == 1_000
    t.settle(TP, 0, e)
    t.committed(TP, 1)
    assert t.oldest_uncommitted_timestamp(TP) == 1_001


def test_backpressure_engages_at_the_bound_and_releases_below_low_water() -> None:
    bp = InFlightGate(LimitsSpec(max_in_flight_messages=100, max_in_flight_bytes=10_000))
    assert bp.update(99, 0) is False
    assert bp.update(100, 0) is True
    assert bp.update(60, 0) is True  # hysteresis: not yet below half
    assert bp.update(50, 0) is False
    assert bp.update(1, 10_000) is True  # the byte bound counts too
    assert bp.capacity(70) == 30


def test_consumer_config_forces_manual_commits_and_takes_static_membership() -> None:
    from offtake.config import parse_pipeline
    from offtake.kafka.config import consumer_config, producer_config

    doc = {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "kafka": {
                "bootstrapServers": "k:9092",
                "config": {"enable.auto.commit": True, "session.timeout.ms": 7000},
            },
            "source": {"topics": ["a"], "startFrom": "latest"},
            "sink": {"kafka": {"topic": "b", "config": {"linger.ms": 20}}},
        },
    }
    spec = parse_pipeline(doc)
    conf = consumer_config(spec, instance_id="orders-7f9c-0")
    assert conf["enable.auto.commit"] == "false" and conf["enable.auto.offset.store"] == "false"
    assert conf["group.id"] == "ns.p" and conf["auto.offset.reset"] == "latest"
    assert conf["partition.assignment.strategy"] == "cooperative-sticky"
    assert conf["group.instance.id"] == "orders-7f9c-0"
    assert conf["session.timeout.ms"] == "7000"
    prod = producer_config(spec, spec.sink.kafka.config if spec.sink.kafka else None)
    assert prod["enable.idempotence"] == "true" and prod["acks"] == "all"
    assert prod["linger.ms"] == "20" and "session.timeout.ms" not in prod


def test_consumer_prefetch_follows_the_in_flight_byte_bound_unless_configured() -> None:
    from offtake.config import parse_pipeline
    from offtake.kafka.config import consumer_config

    def conf(limits: dict[str, int], config: dict[str, str] | None = None) -> dict[str, str]:
        spec = parse_pipeline(
            {
                "apiVersion": "offtake.dev/v1alpha1",
                "kind": "ConsumerPipeline",
                "metadata": {"name": "p", "namespace": "ns"},
                "spec": {
                    "kafka": {"bootstrapServers": "k:9092", "config": config or {}},
                    "source": {"topics": ["a"]},
                    "sink": {"log": {}},
                    "limits": limits,
                },
            }
        )
        return consumer_config(spec)

    assert conf({})["queued.max.messages.kbytes"] == "16384"  # 64 MiB in flight: 16 MiB
    assert conf({"maxInFlightBytes": 1 << 20})["queued.max.messages.kbytes"] == "1024"
    assert conf({"maxInFlightBytes": 1 << 30})["queued.max.messages.kbytes"] == "65536"
    own = conf({}, {"queued.max.messages.kbytes": "4096"})
    assert own["queued.max.messages.kbytes"] == "4096"
    # Past the bound, the next fetch waits 10 ms, not librdkafka's 1 s (a drained queue idled
    # the worker); the user's own value wins.
    assert conf({})["fetch.queue.backoff.ms"] == "10"
    assert conf({}, {"fetch.queue.backoff.ms": "250"})["fetch.queue.backoff.ms"] == "250"


def test_settlements_find_their_chunk_among_many_with_gaps_between_them() -> None:
    # A chunk per poll; offsets skip (compaction, transaction markers). Settlements arrive
    # newest first as well as oldest first, as runs and alone; an offset between chunks
    # belongs to none and settles nothing.
    t = OffsetTracker()
    e = t.assign(TP)
    chunks = [[0, 1, 2], [5, 6], [9], [12, 13, 14, 15]]
    for chunk in chunks:
        t.register_batch(TP, chunk, 10 * len(chunk), None)
    assert t.settle_many(TP, [12, 13, 14, 15], e)
    assert t.settle(TP, 3, e) and t.settle(TP, 16, e)  # in no chunk: nothing settles
    assert t.pending_in(None) == 6 and t.position(TP) == 0
    assert t.settle(TP, 6, e) and t.settle(TP, 9, e)
    assert t.position(TP) == 0
    assert t.settle_many(TP, [0, 1, 2], e)
    assert t.position(TP) == 5  # 5 pending: nothing at or above it is committed
    assert t.settle(TP, 5, e)
    assert t.pending_in(None) == 0 and t.position(TP) == 16


def test_a_chunk_that_starts_lower_than_an_older_one_hides_nothing() -> None:
    # A share group may deliver a record again (its lock expired) while the poll that first
    # brought it is still tracked: the newer chunk starts below the older ones.
    t = OffsetTracker()
    e = t.assign(TP)
    t.register_batch(TP, [100, 101, 102], 30, None)
    t.register_batch(TP, [103, 104], 20, None)
    t.register_batch(TP, [101], 10, None)  # delivered again
    assert t.pending_in(None) == 6
    assert t.settle_many(TP, [103, 104], e) and t.pending_in(None) == 4
    assert t.settle(TP, 102, e) and t.pending_in(None) == 3
    assert t.settle(TP, 101, e) and t.pending_in(None) == 2
