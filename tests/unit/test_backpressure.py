"""PartitionPauser, the one owner of pause state: backpressure and retry delays together."""

from __future__ import annotations

from typing import Any

from offtake.engine.backpressure import PartitionPauser
from offtake.metrics import Metrics
from offtake.records import TopicPartition

SRC, RETRY = TopicPartition("orders", 0), TopicPartition("orders.retry-10s", 0)


class FakeSource:
    """Records the consumer's pause state and seeks, as librdkafka would hold them."""

    def __init__(self, refuse_seek: bool = False) -> None:
        self.paused: set[TopicPartition] = set()
        self.seeks: list[tuple[TopicPartition, int]] = []
        self.refuse_seek = refuse_seek

    def pause(self, partitions: Any) -> None:
        self.paused |= set(partitions)

    def resume(self, partitions: Any) -> None:
        self.paused -= set(partitions)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        if self.refuse_seek:
            raise RuntimeError("Local: Erroneous state")
        self.seeks.append((tp, offset))


def pauser(source: FakeSource) -> PartitionPauser:
    return PartitionPauser(source, Metrics("p"))  # type: ignore[arg-type]


def test_backpressure_released_does_not_resume_a_partition_waiting_for_its_record() -> None:
    source = FakeSource()
    p = pauser(source)
    assert p.hold(RETRY, 42, until=100.0)
    assert source.paused == {RETRY} and source.seeks == [(RETRY, 42)]
    p.apply({SRC, RETRY}, True)  # backpressure
    assert source.paused == {SRC, RETRY}
    p.apply({SRC, RETRY}, False)  # released: the retry partition still waits
    assert source.paused == {RETRY}
    p.release_due(99.9)
    assert source.paused == {RETRY}
    p.release_due(100.0)
    assert source.paused == set() and not p.held


def test_a_due_partition_stays_paused_while_backpressure_holds_it() -> None:
    source = FakeSource()
    p = pauser(source)
    p.hold(RETRY, 7, until=10.0)
    p.apply({SRC, RETRY}, True)
    p.release_due(11.0)
    assert source.paused == {SRC, RETRY}  # due, but backpressure still pauses everything
    p.apply({SRC, RETRY}, False)
    assert source.paused == set()


def test_revoked_partitions_are_forgotten_and_a_refused_seek_holds_nothing() -> None:
    source = FakeSource()
    p = pauser(source)
    p.hold(RETRY, 7, until=10.0)
    p.forget({RETRY})
    assert not p.held
    refusing = FakeSource(refuse_seek=True)
    q = pauser(refusing)
    assert not q.hold(RETRY, 7, until=10.0)  # the caller takes the record now instead
    assert not q.held and refusing.paused == set()


def test_forgetting_paused_partitions_updates_the_paused_gauge() -> None:
    # A revoke while paused: the gauge must say so at once, not at the next pause decision
    # (the poll loop makes none while nothing is paused).
    source = FakeSource()
    p = pauser(source)
    p.apply({SRC, RETRY}, True)
    assert p.metrics.paused_partitions._value.get() == 2
    p.forget({SRC, RETRY})
    assert not p.paused and p.metrics.paused_partitions._value.get() == 0


# -- shares of the in-flight bound (processor.concurrency with lanes) -----------------------------
A, B = TopicPartition("orders", 1), TopicPartition("orders", 2)


def test_a_full_partition_stops_fetching_and_resumes_from_its_last_record() -> None:
    source = FakeSource()
    p = pauser(source)
    consumed_to = {A: 1_200, B: 40}.get
    p.share({A}, set(), consumed_to)
    assert source.paused == {A} and p.full == {A}
    p.share({A}, set(), consumed_to)  # still full: paused once, no seek
    assert source.seeks == []
    p.share(set(), {A, B}, consumed_to)  # below half: fetch on, from one past the last consumed
    assert source.paused == set() and p.full == set()
    assert source.seeks == [(A, 1_200)]  # B was never full: neither sought nor resumed


def test_a_share_does_not_resume_what_backpressure_or_a_retry_delay_holds() -> None:
    source = FakeSource()
    p = pauser(source)
    consumed_to = {A: 5, RETRY: 9}.get
    p.share({A, RETRY}, set(), consumed_to)
    p.apply({A, SRC}, True)  # backpressure pauses everything assigned
    p.hold(RETRY, 9, until=100.0)
    p.share(set(), {A, RETRY}, consumed_to)  # below its share, but still held by the others
    assert source.paused == {A, SRC, RETRY}
    p.apply({A, SRC, RETRY}, False)
    assert source.paused == {RETRY}
    p.release_due(100.0)
    assert source.paused == set()


def test_backpressure_released_leaves_a_full_partition_paused() -> None:
    source = FakeSource()
    p = pauser(source)
    p.share({A}, set(), {A: 3}.get)
    p.apply({A, B}, True)
    p.apply({A, B}, False)
    assert source.paused == {A}  # still full
    p.forget({A})  # revoked: its share is forgotten with it
    assert p.full == set()
