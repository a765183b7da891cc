"""Delivery modes (engine/delivery/) against a fake loop and source: what each mode's own
hooks do (the rules all modes share: tests/contract/test_delivery_contract.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from support.delivery_fakes import (
    FakeConsumerSide,
    FakeLoop,
    FakeSource,
    FakeStage,
    FakeTransactionalSink,
)

from offtake.engine.commits import Committer
from offtake.engine.delivery.at_least_once import COMMIT_RETRY_FLOOR, AtLeastOnce
from offtake.engine.delivery.transactional import Transactional, TransactionCommitter
from offtake.engine.exit_codes import EXIT_FATAL
from offtake.engine.offsets import OffsetTracker
from offtake.engine.settlements import Settled, SettledMany
from offtake.metrics import Metrics
from offtake.records import TopicPartition

TP = TopicPartition("in", 0)
OTHER = TopicPartition("in", 1)


def at_least_once(loop: FakeLoop) -> tuple[AtLeastOnce, FakeSource, int]:
    source = FakeSource()
    tracker = OffsetTracker()
    source_any: Any = source
    policy = AtLeastOnce(Committer(source_any, tracker, Metrics("t"), 5.0, 1_000))
    source.policy = policy
    policy.bind(loop)
    epoch = tracker.assign(TP)
    tracker.assign(OTHER)
    tracker.register_batch(TP, [10, 11, 12], 30, None)
    return policy, source, epoch


def test_at_the_bound_it_commits_synchronously_but_not_in_a_tight_loop() -> None:
    policy, source, epoch = at_least_once(FakeLoop())
    now = time.monotonic()
    assert not policy.at_bound(now)  # nothing settled: a commit would free nothing
    policy.settle(SettledMany(TP, [10, 11, 12], epoch, "delivered"))
    assert policy.at_bound(now)
    assert source.commits == [({TP: 13}, False)]
    assert policy.tracker.inflight_messages == 0  # the acknowledgement freed the room
    policy.tracker.register_batch(TP, [13], 10, None)
    policy.settle(Settled(TP, 13, epoch, "delivered"))
    assert not policy.at_bound(now + 0.001)  # spaced: the loop waits instead
    assert policy.at_bound(now + 1.0)


def test_a_revoke_drains_those_partitions_and_commits_what_was_delivered() -> None:
    loop = FakeLoop(drained=True)
    policy, source, epoch = at_least_once(loop)
    policy.settle(SettledMany(TP, [10, 11, 12], epoch, "delivered"))
    deadline = time.monotonic() + 1.0
    released = policy.revoking({TP}, deadline)
    assert released.drained and released.committed
    assert loop.drains == [({TP}, deadline)] and loop.abandoned == []
    assert source.commits == [({TP: 13}, False)]


def test_a_revoke_past_the_drain_budget_abandons_and_commits_what_settled() -> None:
    loop = FakeLoop(drained=False)
    policy, source, epoch = at_least_once(loop)
    policy.settle(Settled(TP, 10, epoch, "delivered"))
    released = policy.revoking({TP}, time.monotonic())
    assert not released.drained and released.committed
    assert loop.abandoned == [{TP}]
    assert source.commits == [({TP: 11}, False)]  # up to the first unsettled record


def test_the_commit_before_letting_go_may_retry_past_a_spent_drain_budget() -> None:
    policy, _, _ = at_least_once(FakeLoop())
    spent = time.monotonic() - 1.0
    assert policy._commit_by(spent) >= time.monotonic() + COMMIT_RETRY_FLOOR - 0.1
    policy.final_commit(spent)  # shutdown: its deadline holds for the revoke close() brings
    assert policy._commit_by(time.monotonic() + 100.0) == policy._final_commit_by


def transactional(
    loop: FakeLoop, sink: FakeTransactionalSink
) -> tuple[Transactional, FakeConsumerSide, int]:
    source = FakeConsumerSide()
    tracker = OffsetTracker()
    anys: tuple[Any, Any, Any] = (source, FakeStage(), sink)
    committer = TransactionCommitter(anys[0], tracker, Metrics("t"), 0.0, 1_000, anys[1], anys[2])
    policy = Transactional(committer, anys[0], drain_timeout=1.0)
    policy.bind(loop)
    epoch = tracker.assign(TP)
    tracker.register_batch(TP, [10, 11, 12], 30, None)
    return policy, source, epoch


def test_a_transaction_commits_after_draining_every_partition() -> None:
    loop, sink = FakeLoop(), FakeTransactionalSink()
    policy, _, epoch = transactional(loop, sink)
    policy.settle(SettledMany(TP, [10, 11, 12], epoch, "delivered"))
    policy.step(time.monotonic())
    assert [p for p, _ in loop.drains] == [None]  # every partition: one transaction holds all
    assert sink.committed == [{TP: 13}]
    assert policy.tracker.inflight_messages == 0 and loop.failures == []
    assert not policy.at_bound(time.monotonic())  # no commit of its own at the bound


def test_a_transaction_refused_by_a_rebalance_consumes_its_records_again() -> None:
    loop, sink = FakeLoop(), FakeTransactionalSink(refuse="generation id is not valid")
    policy, source, epoch = transactional(loop, sink)
    policy.settle(SettledMany(TP, [10, 11, 12], epoch, "delivered"))
    released = policy.revoking({TP}, time.monotonic() + 1.0)
    assert not released.drained and loop.abandoned == [{TP}]
    assert source.seeks == [(TP, 10)]  # back to the oldest record of the aborted transaction
    assert policy.tracker.epoch(TP) != epoch and loop.changes == 1  # old work goes stale
    assert loop.failures == [] and policy.committer.broken is None  # commits again


def test_a_fenced_producer_is_renewed_and_its_records_consumed_again() -> None:
    loop, sink = FakeLoop(), FakeTransactionalSink(refuse="fenced", fenced=True)
    policy, source, epoch = transactional(loop, sink)
    policy.settle(SettledMany(TP, [10, 11, 12], epoch, "delivered"))
    policy.step(time.monotonic())
    assert sink.renewals == 1 and loop.failures == []  # a new epoch, no restart
    assert source.seeks == [(TP, 10)] and policy.tracker.epoch(TP) != epoch


def test_an_unfinished_drain_abandons_aborts_and_consumes_again() -> None:
    loop, sink = FakeLoop(drained=False), FakeTransactionalSink()
    policy, source, epoch = transactional(loop, sink)
    policy.settle(SettledMany(TP, [10, 11], epoch, "delivered"))
    policy.step(time.monotonic())
    assert sink.aborts == 1 and sink.committed == []
    assert loop.abandoned == [{TP}]  # nothing under way reaches the producer after the abort
    assert source.seeks == [(TP, 10)] and loop.failures == []


def test_only_aborts_in_a_row_past_the_bound_stop_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(time, "sleep", lambda s: None)  # the backoff between attempts
    loop, sink = FakeLoop(), FakeTransactionalSink(refuse="fenced", fenced=True, renewable=False)
    policy, _, epoch = transactional(loop, sink)
    policy.settle(SettledMany(TP, [10], epoch, "delivered"))
    policy.step(time.monotonic())
    assert [code for code, _ in loop.failures] == [EXIT_FATAL]
    assert "in a row aborted" in loop.failures[0][1] and "fenced" in loop.failures[0][1]


def test_losing_partitions_aborts_the_open_transaction_and_goes_on() -> None:
    loop, sink = FakeLoop(), FakeTransactionalSink()
    policy, _, _ = transactional(loop, sink)
    policy.lost({TP})
    assert sink.aborts == 1
    assert loop.failures == []


def test_after_a_fenced_last_transaction_leaving_the_group_neither_commits_nor_renews() -> None:
    # Found by tests/worker/test_exactly_once_on_kafka.py without its sleep: the broker had
    # fenced the producer (transaction.timeout.ms passed), the last commit at SIGTERM failed,
    # and the revoke that close() brings then renewed the producer through the processing
    # thread that had already stopped: the watchdog killed the worker (exit 14) instead of it
    # exiting 0 with the records left to the next owner.
    loop, sink = FakeLoop(), FakeTransactionalSink(refuse="fenced", fenced=True)
    policy, source, epoch = transactional(loop, sink)
    policy.settle(SettledMany(TP, [10, 11, 12], epoch, "delivered"))
    policy.end(drained=True)
    assert policy.ended is False and sink.committed == []
    released = policy.revoking({TP}, time.monotonic() + 1.0)
    policy.lost({TP})
    assert not released.committed and loop.abandoned == [{TP}]
    assert sink.renewals == 0 and source.seeks == [] and loop.failures == []


def test_after_a_committed_last_transaction_the_revoke_commits_nothing_more() -> None:
    loop, sink = FakeLoop(), FakeTransactionalSink()
    policy, _, epoch = transactional(loop, sink)
    policy.settle(SettledMany(TP, [10, 11, 12], epoch, "delivered"))
    policy.end(drained=True)
    released = policy.revoking({TP}, time.monotonic() + 1.0)
    assert released.committed and sink.committed == [{TP: 13}] and loop.abandoned == []
