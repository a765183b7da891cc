"""The exactly-once sink's renewable producer (offtake.kafka.transactional_producer): a failed
record dooms its transaction only, and a renewal replaces the client under every user at once."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from offtake.kafka import transactional_producer
from offtake.kafka.transactional_producer import TransactionalProducer, TransactionCallStuck


class FakeClient:
    """Records calls; delivery reports are fired by the test through ``reports``."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.reports: list[Any] = []
        self.purged = False

    def produce(
        self, topic: str, value: Any, key: Any, partition: int, cb: Any, *rest: Any, **kw: Any
    ) -> None:
        self.reports.append(cb)

    def poll(self, timeout: float = 0.0) -> int:
        return 0

    def flush(self, timeout: float = -1) -> int:
        return 0

    def __len__(self) -> int:
        return len(self.reports)

    def purge(self) -> None:
        self.purged = True

    def init_transactions(self, timeout: float) -> None:
        self.calls.append("init")

    def begin_transaction(self) -> None:
        self.calls.append("begin")


def test_a_failed_delivery_dooms_the_open_transaction_and_reports_the_record_as_handed_over() -> (
    None
):
    client = FakeClient()
    producer = TransactionalProducer(lambda: client)
    producer.begin_transaction()
    seen: list[Any] = []
    producer.produce("out", b"v", b"k", -1, lambda err, msg: seen.append(err))
    client.reports[0]("KafkaError{code=_MSG_TIMED_OUT}", None)
    assert producer.doomed is not None and "_MSG_TIMED_OUT" in producer.doomed
    assert seen == [None]  # the record's fate is its transaction's, not a dead letter
    producer.begin_transaction()
    assert producer.doomed is None


def test_a_late_report_of_an_earlier_transaction_dooms_nothing() -> None:
    client = FakeClient()
    producer = TransactionalProducer(lambda: client)
    producer.begin_transaction()
    producer.produce("out", b"v", None, -1, None)
    producer.begin_transaction()  # the first one was aborted; its purged record reports late
    client.reports[0]("KafkaError{code=_PURGE_QUEUE}", None)
    assert producer.doomed is None


def test_renew_purges_the_old_client_and_starts_a_new_one_with_transactions() -> None:
    clients = [FakeClient(), FakeClient()]
    made = iter(clients)
    producer = TransactionalProducer(lambda: next(made))
    producer.init_transactions(1.0)
    producer.renew(1.0)
    assert clients[0].purged
    assert clients[1].calls == ["init"]
    assert producer.renewals == 1
    producer.produce("out", b"v", None, -1, None)
    assert (
        len(clients[1].reports) == 1 and not clients[0].reports
    )  # every user writes to the new one


class FatalClient(FakeClient):
    """A fenced client: librdkafka raises its fatal error from produce and poll."""

    def produce(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("KafkaError{FATAL,code=INVALID_TXN_STATE}")

    def poll(self, timeout: float = 0.0) -> int:
        raise RuntimeError("KafkaError{FATAL,code=INVALID_TXN_STATE}")


def test_a_fatal_client_dooms_the_transaction_instead_of_failing_the_thread() -> None:
    producer = TransactionalProducer(FatalClient)
    producer.begin_transaction()
    seen: list[Any] = []
    producer.produce("out", b"v", None, -1, lambda err, msg: seen.append(err))
    assert seen == [None]  # reported at once: no delivery report will come
    assert producer.poll(0) == 0
    assert producer.doomed is not None and "INVALID_TXN_STATE" in producer.doomed


class FullClient(FakeClient):
    """A client whose local queue stays full (a transaction in an abortable state)."""

    def produce(self, *args: Any, **kwargs: Any) -> None:
        raise BufferError("Local: Queue full")


def test_a_queue_that_stays_full_dooms_the_transaction_after_its_timeout() -> None:
    producer = TransactionalProducer(FullClient, queue_wait=0.2)
    producer.begin_transaction()
    seen: list[Any] = []
    producer.produce("out", b"v", None, -1, lambda err, msg: seen.append(err))
    assert seen == [None]  # the thread is free again: it can abort the transaction
    assert producer.doomed is not None and "stayed full" in producer.doomed


class StuckClient(FakeClient):
    """librdkafka's send_offsets_to_transaction waiting for an answer that never comes (seen
    after a broker bounce), until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self.release.wait(30)

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")


def test_a_transaction_call_that_does_not_return_gives_its_client_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transactional_producer, "CALL_GRACE", 0.2)
    stuck, fresh = StuckClient(), FakeClient()
    made = iter([stuck, fresh])
    producer = TransactionalProducer(lambda: next(made))
    producer.begin_transaction()
    started = time.monotonic()
    with pytest.raises(TransactionCallStuck, match="send_offsets_to_transaction did not return"):
        producer.send_offsets_to_transaction([], None, 0.1)
    assert time.monotonic() - started < 5  # the caller is free again
    assert producer.doomed is not None  # the transaction cannot commit
    with pytest.raises(TransactionCallStuck):  # nothing more goes to the stuck client
        producer.abort_transaction(0.1)
    assert "abort" not in stuck.calls
    producer.renew(1.0)  # a new client, a new epoch: the way out
    assert fresh.calls == ["init"]
    producer.begin_transaction()
    assert producer.doomed is None
    stuck.release.set()


def test_a_transaction_calls_own_error_reaches_the_caller() -> None:
    class Refusing(FakeClient):
        def commit_transaction(self, timeout: float) -> None:
            raise RuntimeError("KafkaError{code=INVALID_TXN_STATE}")

    producer = TransactionalProducer(Refusing)
    with pytest.raises(RuntimeError, match="INVALID_TXN_STATE"):
        producer.commit_transaction(1.0)


def test_reports_served_inside_a_transaction_call_fire_on_the_calling_thread() -> None:
    class Flushing(FakeClient):
        def commit_transaction(self, timeout: float) -> None:
            for report in self.reports:  # librdkafka's commit flushes, serving reports
                report(None, "msg")

    client = Flushing()
    producer = TransactionalProducer(lambda: client)
    producer.begin_transaction()
    threads: list[str] = []
    producer.produce("out", b"v", None, -1, lambda err, msg: threads.append(_thread_name()))
    producer.commit_transaction(1.0)
    assert threads == [_thread_name()]


def _thread_name() -> str:
    return threading.current_thread().name


class _Error:
    """A KafkaError's shape: retriable() and str()."""

    def __init__(self, text: str, retriable: bool) -> None:
        self._text, self._retriable = text, retriable

    def retriable(self) -> bool:
        return self._retriable

    def str(self) -> str:
        return self._text

    def __str__(self) -> str:
        return self._text


class LoadingCoordinator(FakeClient):
    """init_transactions fails ``failures`` times with ``error`` before it succeeds."""

    def __init__(self, failures: int, retriable: bool) -> None:
        super().__init__()
        self.failures = failures
        self.error = _Error("Coordinator load in progress", retriable)

    def init_transactions(self, timeout: float) -> None:
        self.calls.append("init")
        if self.failures:
            self.failures -= 1
            raise Exception(self.error)


def test_init_transactions_calls_again_while_the_failure_is_retriable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transactional_producer, "INIT_RETRY_PAUSE", 0.01)
    client = LoadingCoordinator(failures=2, retriable=True)
    TransactionalProducer(lambda: client).init_transactions(5.0)
    assert client.calls == ["init", "init", "init"]


def test_init_transactions_raises_a_failure_that_is_not_retriable_at_once() -> None:
    client = LoadingCoordinator(failures=1, retriable=False)
    with pytest.raises(Exception, match="Coordinator load") as caught:
        TransactionalProducer(lambda: client).init_transactions(5.0)
    assert caught.value.args[0] is client.error
    assert client.calls == ["init"]


def test_init_transactions_gives_up_on_a_retriable_failure_at_its_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transactional_producer, "INIT_RETRY_PAUSE", 0.05)
    client = LoadingCoordinator(failures=1_000, retriable=True)
    started = time.monotonic()
    with pytest.raises(Exception, match="Coordinator load"):
        TransactionalProducer(lambda: client).init_transactions(0.3)
    assert time.monotonic() - started < 2.0
    assert 2 <= len(client.calls) <= 8
