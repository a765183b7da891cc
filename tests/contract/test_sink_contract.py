"""The sink contract (offtake/sinks/base.py), run on every sink implementation.

The same test bodies run on the log sink, the Kafka sink on the memory broker and on the real
broker, and the Spark sink writing parquet (conftest.py's ``contract`` fixture). Where a sink
legitimately differs, the test branches on its :class:`~.sinks.Capabilities`.
"""

from __future__ import annotations

import threading
from itertools import chain, zip_longest

from offtake.sinks.base import SinkItem

from .sinks import SETTLE_SECONDS, Contract, make_item, tp, values_of


def interleaved(*partitions: list[SinkItem]) -> list[SinkItem]:
    """Items of several partitions in the order a consumer would hand them over."""
    return [it for it in chain.from_iterable(zip_longest(*partitions)) if it is not None]


def _once_each(contract: Contract, items: list[SinkItem]) -> None:
    counts = {it.record.where(): contract.times_settled(it) for it in items}
    assert all(n == 1 for n in counts.values()), f"settlements per record: {counts}"


def test_every_item_completes_once_and_its_values_land(contract: Contract) -> None:
    items = [make_item(p, o) for o in range(10) for p in (0, 1)]
    for it in items:
        contract.submit(it)
    contract.settle(items)
    _once_each(contract, items)
    assert contract.errors() == []
    assert contract.case.written() == values_of(items)


def test_a_record_with_many_values_completes_once_when_all_are_written(
    contract: Contract,
) -> None:
    items = [make_item(0, 0, n_values=3), make_item(0, 1), make_item(1, 0, n_values=5)]
    for it in items:
        contract.submit(it)
    contract.settle(items)
    _once_each(contract, items)
    assert contract.errors() == []
    assert contract.case.written() == values_of(items)


def test_an_item_without_values_completes_and_writes_nothing(contract: Contract) -> None:
    empty, full = make_item(0, 0, n_values=0), make_item(0, 1, n_values=2)
    contract.submit(empty)
    contract.submit(full)
    contract.settle([empty, full])
    _once_each(contract, [empty, full])
    assert contract.errors() == []
    assert contract.case.written() == values_of([full])


def test_a_batch_of_a_partitions_records_settles_each_record_once(contract: Contract) -> None:
    """The engine's unit: one poll's records of a partition, handed over as one batch."""
    p0 = [make_item(0, o, n_values=1 + o % 3) for o in range(40)]
    p1 = [make_item(1, o, n_values=o % 2) for o in range(10)]  # some without values
    contract.submit(*p0)
    contract.submit(*p1)
    contract.settle(p0 + p1)
    _once_each(contract, p0 + p1)
    assert contract.errors() == []
    assert contract.case.written() == values_of(p0 + p1)


def test_settlements_run_only_inside_submit_poll_or_drain_on_the_calling_thread(
    contract: Contract,
) -> None:
    """As in the engine: a processing thread submits and polls while the loop polls too."""
    items = [make_item(p, o, n_values=2) for o in range(25) for p in (0, 1)]
    failures: list[BaseException] = []

    def processing() -> None:
        try:
            for it in items:
                contract.submit(it)
                contract.poll()
        except BaseException as exc:  # surfaced below: a thread's exception is otherwise lost
            failures.append(exc)

    worker = threading.Thread(target=processing, name="offtake-processing")
    worker.start()
    while worker.is_alive():
        contract.poll()
        worker.join(0.005)
    assert failures == []
    contract.settle(items)
    _once_each(contract, items)
    assert contract.outside_calls == [], "settlements ran outside submit/poll/drain"


def test_poll_alone_completes_what_was_submitted(contract: Contract) -> None:
    items = [make_item(0, o) for o in range(5)]
    for it in items:
        contract.submit(it)
    contract.settle(items, poll_only=True)
    _once_each(contract, items)
    assert contract.case.written() == values_of(items)


def test_drain_of_some_partitions_completes_all_of_theirs(contract: Contract) -> None:
    p0 = [make_item(0, o) for o in range(6)]
    p1 = [make_item(1, o) for o in range(4)]
    for it in interleaved(p0, p1):
        contract.submit(it)
    assert contract.drain([tp(0)], SETTLE_SECONDS)
    _once_each(contract, p0)  # the other partition's items may or may not be done yet
    contract.settle(p1)
    _once_each(contract, p0 + p1)


def test_drain_returns_false_when_time_runs_out_and_true_once_done(contract: Contract) -> None:
    items = [make_item(0, o) for o in range(3)]
    if contract.caps.can_hold:
        with contract.case.held():
            for it in items:
                contract.submit(it)
            assert not contract.drain([tp(0)], 0.5)
            assert contract.settled(items) == []
    else:
        for it in items:
            contract.submit(it)
    assert contract.drain([tp(0)], SETTLE_SECONDS)
    _once_each(contract, items)
    assert contract.drain([tp(0)], 0.0)  # nothing left to wait for
    assert contract.drain(None, 0.0)
    assert contract.case.written() == values_of(items)


def test_abandon_drops_those_partitions_and_leaves_the_others(contract: Contract) -> None:
    lost = [make_item(0, o, n_values=2) for o in range(5)]
    kept = [make_item(1, o) for o in range(5)]
    for it in interleaved(lost, kept):
        contract.submit(it)
    done_before = contract.settled(lost)
    assert contract.abandon([tp(0)]) == len(lost) - len(done_before)
    contract.settle(kept)
    assert contract.drain(None, 5.0)  # every chance for abandoned work to complete (wrongly)
    assert contract.settled(lost) == done_before
    _once_each(contract, kept + done_before)
    sent = done_before if contract.caps.abandon_withholds_writes else lost
    assert contract.case.written() == sorted(values_of(kept) + values_of(sent))


def test_a_partition_abandoned_and_assigned_back_takes_new_items(contract: Contract) -> None:
    before = [make_item(0, o) for o in range(3)]
    for it in before:
        contract.submit(it)
    done_before = contract.settled(before)
    contract.abandon([tp(0)])
    again = [make_item(0, o, epoch=1) for o in range(3)]  # reassigned: the same offsets again
    for it in again:
        contract.submit(it)
    contract.settle(again)
    _once_each(contract, again + done_before)
    assert contract.settled(before) == done_before
    sent = done_before if contract.caps.abandon_withholds_writes else before
    assert contract.case.written() == sorted(values_of(again) + values_of(sent))


def test_close_is_idempotent_and_reports_nothing_more(contract: Contract) -> None:
    assert contract.drain(None, 0.0)  # nothing submitted: nothing to wait for
    items = [make_item(0, o) for o in range(3)]
    for it in items:
        contract.submit(it)
    contract.settle(items)
    contract.close()
    contract.close()
    _once_each(contract, items)
    assert contract.outside_calls == []


def test_a_destination_that_refuses_writes_fails_each_record_once(contract: Contract) -> None:
    contract.case.break_destination()
    items = [make_item(0, o, n_values=2) for o in range(3)]
    for it in items:
        contract.submit(it)  # never raises: a record the sink cannot take fails in its batch
    contract.settle(items)
    _once_each(contract, items)
    if contract.caps.failure == "dooms-transaction":
        assert contract.errors() == []  # no dead letter for a broker's refusal...
        assert contract.case.written() == []  # ...the commit aborts: nothing read_committed
        return
    errors = contract.errors()
    assert len(errors) == len(items)
    assert all("orders" in str(e) for e in errors), errors  # the error names the source
    assert contract.case.written() == []
