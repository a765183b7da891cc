"""Batch identity and bounds (no Spark needed)."""

from __future__ import annotations

import pytest

from offtake.config.spec import SparkBatchSpec
from offtake.records import TopicPartition
from offtake.sinks.spark.batching import Batcher, BatchId

from .support import item


def batch_spec(
    max_records: int, max_interval_seconds: float = 60.0, max_bytes: int = 1 << 27
) -> SparkBatchSpec:
    return SparkBatchSpec(
        max_records=max_records, max_interval_seconds=max_interval_seconds, max_bytes=max_bytes
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_identity_is_topic_partition_and_offset_range() -> None:
    b = Batcher(batch_spec(max_records=3))
    closed = [c for it in [item(o) for o in (10, 11, 12)] for c in b.add(it)]
    assert len(closed) == 1
    assert closed[0].id == BatchId("orders", 0, 10, 12)
    assert str(closed[0].id) == "orders-0-10-12"


def test_identity_round_trips_through_its_name_even_with_dashes_in_the_topic() -> None:
    bid = BatchId("shop.orders-v2-eu", 11, 1_000_000, 1_000_099)
    assert BatchId.parse(str(bid)) == bid
    for bad in ("orders-0-1", "orders-x-1-2", "-0-1-2", "orders-0-5-2"):
        with pytest.raises(ValueError):
            BatchId.parse(bad)


def test_max_records_bound() -> None:
    b = Batcher(batch_spec(max_records=100))
    closed = [c for it in [item(o) for o in range(250)] for c in b.add(it)]
    assert [str(c.id) for c in closed] == ["orders-0-0-99", "orders-0-100-199"]
    assert [len(c) for c in b.close(None)] == [50]


def test_max_bytes_bound() -> None:
    one = item(0).record.size
    b = Batcher(batch_spec(max_records=1000, max_bytes=one * 4))
    closed = [c for it in [item(o) for o in range(10)] for c in b.add(it)]
    assert [len(c) for c in closed] == [4, 4]
    assert closed[0].nbytes >= one * 4


def test_interval_bound_counts_from_the_first_item() -> None:
    clock = Clock()
    b = Batcher(batch_spec(max_records=1000, max_interval_seconds=5), clock)
    b.add(item(0))
    clock.now += 4
    b.add(item(1))
    assert b.due() == []
    clock.now += 1
    due = b.due()
    assert [str(d.id) for d in due] == ["orders-0-0-1"]
    assert b.close(None) == []


def test_partitions_batch_separately_and_close_selectively() -> None:
    b = Batcher(batch_spec(max_records=1000))
    for o in range(5):
        b.add(item(o, partition=0))
        b.add(item(o, partition=1))
    closed = b.close([TopicPartition("orders", 1)])
    assert [str(c.id) for c in closed] == ["orders-1-0-4"]
    assert [str(c.id) for c in b.close(None)] == ["orders-0-0-4"]


def test_rewind_or_new_epoch_closes_the_batch_so_ranges_stay_exact() -> None:
    b = Batcher(batch_spec(max_records=1000))
    for o in (5, 6, 7):
        b.add(item(o))
    closed = b.add(item(3))  # a rewind: offsets go back
    assert [str(c.id) for c in closed] == ["orders-0-5-7"]
    closed = b.add(item(4, epoch=1))  # reassigned: a new epoch
    assert [str(c.id) for c in closed] == ["orders-0-3-3"]
    assert [str(c.id) for c in b.close(None)] == ["orders-0-4-4"]


def test_rows_count_values_not_items() -> None:
    b = Batcher(batch_spec(max_records=1000))
    it = item(0)._replace(values=[{"a": 1}, {"a": 2}])
    b.add(it)
    dropped = item(1)._replace(values=[])
    b.add(dropped)
    (batch,) = b.close(None)
    assert len(batch) == 2 and batch.rows == 2


def test_supersedes_only_batches_starting_inside_the_range() -> None:
    new = BatchId("t", 0, 100, 199)
    assert new.supersedes(BatchId("t", 0, 100, 149))  # same start, other end
    assert new.supersedes(BatchId("t", 0, 150, 400))  # starts inside
    assert not new.supersedes(BatchId("t", 0, 0, 120))  # starts before: a rewind, keep it
    assert not new.supersedes(BatchId("t", 0, 200, 300))
    assert not new.supersedes(BatchId("t", 1, 100, 199))
