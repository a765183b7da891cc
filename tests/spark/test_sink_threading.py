"""The sink's contract with the engine, with a stand-in for Spark (no JVM): submit and poll
never wait for a job, drain waits only for the asked partitions, abandon drops work."""

from __future__ import annotations

import threading
import time
from typing import Any

from offtake.metrics import Metrics
from offtake.records import TopicPartition
from offtake.sinks.base import SinkBatch
from offtake.sinks.spark import SparkSink
from offtake.sinks.spark.batching import BatchId
from offtake.sinks.spark.writers import Writer

from .support import Collector, item, items, pipeline

P0, P1 = TopicPartition("orders", 0), TopicPartition("orders", 1)


class FakeSession:
    def createDataFrame(self, table: Any) -> Any:
        return table


class GatedWriter(Writer):
    """Blocks each write until released, and records what it wrote."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()
        self.written: list[BatchId] = []
        self.skipped: list[BatchId] = []

    def write(self, df: Any, batch: BatchId, still_owned: Any) -> None:
        self.started.set()
        self.gate.wait(30)
        if still_owned():
            self.written.append(batch)
        else:
            self.skipped.append(batch)


def _sink(writer: Writer, **batch: Any) -> tuple[SparkSink, Collector]:
    spec = pipeline({"format": "parquet", "path": "/unused", "batch": batch or {"maxRecords": 10}})
    sink = SparkSink(spec, Metrics("t"), session=FakeSession(), writer=writer)
    done = Collector()
    sink.start(done)
    return sink, done


def test_submit_and_poll_do_not_wait_for_a_running_job() -> None:
    writer = GatedWriter()
    sink, done = _sink(writer)
    for it in items(range(10)):
        sink.submit(SinkBatch.of([it]))
    assert writer.started.wait(10)  # the job runs, blocked in the writer
    began = time.monotonic()
    for it in items(range(10, 1000)):
        sink.submit(SinkBatch.of([it]))
    sink.poll()
    # The job stays blocked until the gate opens, so returning at all shows nothing waited on
    # it; the bound only keeps a regression from hanging the suite.
    assert time.monotonic() - began < 5.0
    assert done.count == 0
    writer.gate.set()
    assert sink.drain(None, 10)
    assert len(done.ok) == 1000 and done.threads == {"MainThread"}
    assert [str(b) for b in writer.written[:2]] == ["orders-0-0-9", "orders-0-10-19"]
    sink.close()


def test_drain_closes_open_batches_of_the_given_partitions_only() -> None:
    writer = GatedWriter()
    writer.gate.set()
    sink, done = _sink(writer, maxRecords=1000, maxIntervalSeconds=3600)
    for it in items(range(5), partition=0) + items(range(7), partition=1):
        sink.submit(SinkBatch.of([it]))
    assert sink.drain([P1], 10)
    assert [str(b) for b in writer.written] == ["orders-1-0-6"]
    assert len(done.ok) == 7 and {it.tp for it in done.ok} == {P1}
    assert sink.drain(None, 10) and len(done.ok) == 12
    sink.close()


def test_drain_times_out_while_a_job_runs_and_can_be_called_again() -> None:
    writer = GatedWriter()
    sink, done = _sink(writer)
    for it in items(range(10)):
        sink.submit(SinkBatch.of([it]))
    assert not sink.drain(None, 0.2)
    assert done.count == 0
    writer.gate.set()
    assert sink.drain(None, 10) and len(done.ok) == 10
    sink.close()


def test_abandon_drops_queued_work_and_stops_the_running_swap() -> None:
    writer = GatedWriter()
    sink, done = _sink(writer)
    for it in items(range(30), partition=0) + items(range(10), partition=1):
        sink.submit(SinkBatch.of([it]))
    assert writer.started.wait(10)  # orders-0-0-9 is running
    sink.submit(SinkBatch.of([item(30)]))  # an open batch of partition 0
    assert sink.abandon([P0]) == 31
    writer.gate.set()
    assert sink.drain(None, 10)
    assert [str(b) for b in writer.skipped] == ["orders-0-0-9"]
    assert [str(b) for b in writer.written] == ["orders-1-0-9"]
    assert {it.tp for it in done.ok} == {P1} and len(done.ok) == 10
    sink.close()


def test_batches_closed_while_a_job_runs_join_the_queued_batch_of_their_partition() -> None:
    writer = GatedWriter()
    now = [0.0]
    spec = pipeline(
        {"format": "parquet", "path": "/u", "batch": {"maxRecords": 12, "maxIntervalSeconds": 1}}
    )
    sink = SparkSink(spec, Metrics("t"), session=FakeSession(), writer=writer, clock=lambda: now[0])
    done = Collector()
    sink.start(done)

    def tick(offsets: range, partition: int = 0) -> None:
        for it in items(offsets, partition=partition):
            sink.submit(SinkBatch.of([it]))
        now[0] += 1.0
        sink.poll()  # the time bound closes the partition's open batch

    tick(range(0, 5))
    assert writer.started.wait(10)  # orders-0-0-4 runs, blocked
    tick(range(5, 10))
    tick(range(10, 15))  # joins 5-9: 10 records fit maxRecords 12
    tick(range(0, 3), partition=1)  # another partition queues on its own
    tick(range(15, 20))  # 5-14 would hold 15 > 12: a batch of its own
    writer.gate.set()
    assert sink.drain(None, 10)
    assert [str(b) for b in writer.written] == [
        "orders-0-0-4",
        "orders-0-5-14",
        "orders-1-0-2",
        "orders-0-15-19",
    ]
    assert len(done.ok) == 23
    sink.close()


class CombiningWriter(Writer):
    """A writer that takes the batches of several partitions in one job, as FileWriter does;
    each job waits for a turn the test gives."""

    combines_batches = True

    def __init__(self) -> None:
        self.turns = threading.Semaphore(0)
        self.running = threading.Semaphore(0)  # released as each job starts
        self.jobs: list[list[str]] = []
        self.skipped: list[BatchId] = []

    def write(self, df: Any, batch: BatchId, still_owned: Any) -> None:
        self.write_batches(df, [batch], lambda _: still_owned())

    def write_batches(self, df: Any, batches: Any, still_owned: Any) -> list[BatchId]:
        self.jobs.append([str(b) for b in batches])
        self.running.release()
        assert self.turns.acquire(timeout=30)
        if len(batches) > 1:  # one job's rows, each marked with its batch's index
            marks = df.column("_offtake_batch").to_pylist()
            assert sorted(set(marks)) == list(range(len(batches)))
        dropped = [b for b in batches if not still_owned(b)]
        self.skipped += dropped
        return dropped


def test_every_queued_batch_shares_the_next_job_in_offset_order() -> None:
    writer = CombiningWriter()
    sink, done = _sink(writer)
    for it in items(range(10), partition=0):
        sink.submit(SinkBatch.of([it]))
    assert writer.running.acquire(timeout=10)  # orders-0-0-9 runs alone, waiting
    # Queued behind it: two batches of partition 0, one each of partitions 1 and 2.
    for it in items(range(10, 30)) + items(range(10), partition=1) + items(range(10), partition=2):
        sink.submit(SinkBatch.of([it]))
    writer.turns.release(3)
    assert sink.drain(None, 10)
    # One job for everything queued behind the running one; partition 0's two batches in
    # offset order (the writer moves them into place in the job's order).
    assert writer.jobs == [
        ["orders-0-0-9"],
        ["orders-0-10-19", "orders-0-20-29", "orders-1-0-9", "orders-2-0-9"],
    ]
    assert len(done.ok) == 50 and not done.failed
    sink.close()


def test_abandoning_a_partition_of_a_shared_job_keeps_the_others() -> None:
    writer = CombiningWriter()
    sink, done = _sink(writer)
    for it in items(range(10), partition=0):
        sink.submit(SinkBatch.of([it]))
    assert writer.running.acquire(timeout=10)  # orders-0-0-9 runs alone, waiting
    for it in items(range(10), partition=1) + items(range(10), partition=2):
        sink.submit(SinkBatch.of([it]))
    writer.turns.release()
    assert writer.running.acquire(timeout=10)  # orders-1-0-9 and orders-2-0-9 run together
    assert sink.abandon([P1]) == 10
    writer.turns.release()
    assert sink.drain(None, 10)
    assert writer.jobs == [["orders-0-0-9"], ["orders-1-0-9", "orders-2-0-9"]]
    assert [str(b) for b in writer.skipped] == ["orders-1-0-9"]
    assert {it.tp for it in done.ok} == {P0, TopicPartition("orders", 2)}
    assert len(done.ok) == 20 and not done.failed
    sink.close()
