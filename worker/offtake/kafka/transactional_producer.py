"""The exactly-once sink's producer, renewable: the one owner of the transactional client.

A transactional producer that was fenced (the coordinator aborted its transaction after
``transaction.timeout.ms``, say while a broker was down) or whose abort failed is unusable for
good: librdkafka raises a fatal error on every later call. Kafka's answer is a new producer with
the same ``transactional.id``: its ``init_transactions()`` bumps the producer epoch, which also
fences whatever the old one might still send. This class is that producer: the sink, the
dead-letter queue and retry sends all produce through it (they are part of the same
transaction), and :meth:`renew` swaps the client underneath all of them at once.

It also keeps librdkafka's rule for a record that fails inside a transaction: the transaction
can no longer commit ("abortable"). So a failed delivery here is not the record's failure
(there is no dead letter or stop for a broker that timed out): it dooms the open transaction,
the record's own report says it was handed to the transaction, and the commit then aborts, so
every record of the transaction is consumed again. Reports from an earlier transaction (purged
by its abort) doom nothing.

It bounds every transaction call (:meth:`_bounded`): librdkafka can wait without end inside one
after a broker bounce, and a client whose call did not return is replaced like a fenced one.

Only the processing thread calls it, like every other producer the engine owns.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from typing import Any

from offtake.errors import OfftakeError
from offtake.kafka.errors import describe, retriable
from offtake.kafka.produce import produce_waiting
from offtake.kafka.protocols import ProducerLike

log = logging.getLogger(__name__)

# Marks the threads that run transaction calls (TransactionalProducer._bounded).
_CALL_THREAD = threading.local()
# How long past its own timeout a librdkafka transaction call may run before it is given up.
CALL_GRACE = 5.0
# The pause between init_transactions calls that failed with a retriable error.
INIT_RETRY_PAUSE = 0.5


class TransactionalProducer:
    """A :class:`ProducerLike` over the current transactional client (see the module)."""

    def __init__(self, make: Callable[[], ProducerLike], queue_wait: float = 60.0) -> None:
        self._make = make
        # How long produce() waits for room in a full local queue (the transaction's timeout).
        self.queue_wait = queue_wait
        self._client: Any = make()
        self.renewals = 0  # how many times a fenced or broken client was replaced
        self._transaction = 0  # counts begin_transaction(): whose reports doom what
        self.doomed: str | None = None  # why the open transaction cannot commit
        self._stuck: str | None = None  # a call on the current client that never returned
        # Delivery reports served on a transaction call's thread, for this producer's owner.
        self._deferred: deque[Callable[[], None]] = deque()

    @property
    def transactional(self) -> bool:
        """Whether the client offers transactions (the in-memory broker's does not)."""
        return hasattr(self._client, "init_transactions")

    # -- ProducerLike ------------------------------------------------------------------------
    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        on_delivery: Callable[[Any, Any], None] | None = None,
        timestamp: int = 0,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
    ) -> None:
        report = self._in_transaction(on_delivery)
        try:
            try:
                # Positional first, as KafkaSink does: the common case parses fastest.
                if headers is None:
                    self._client.produce(topic, value, key, partition, report, timestamp)
                else:
                    self._client.produce(
                        topic, value, key, partition, report, timestamp, headers=headers
                    )
            except BufferError:
                # The local queue is full. Deliveries make room, but a transaction in an
                # abortable state holds its records until the abort, which this same thread
                # must call: wait for room at most the transaction's timeout, then doom it.
                produce_waiting(
                    self._client,
                    topic,
                    deadline=time.monotonic() + self.queue_wait,
                    value=value,
                    key=key,
                    partition=partition,
                    on_delivery=report,
                    timestamp=timestamp,
                    headers=headers,
                )
        except BufferError:
            self._broken(BufferError(f"the local queue stayed full for {self.queue_wait:g}s"))
            report(None, None)  # handed to the transaction, which is now doomed
        except Exception as exc:  # a fatal client (fenced): the transaction cannot commit
            self._broken(exc)
            report(None, None)  # handed to the transaction, whose fate is now known

    def _in_transaction(
        self, report: Callable[[Any, Any], None] | None
    ) -> Callable[[Any, Any], None]:
        transaction = self._transaction

        def delivered(err: Any, msg: Any) -> None:
            if err is not None and transaction == self._transaction and self.doomed is None:
                self.doomed = f"a record of the transaction failed: {describe(err)}"
            if report is None:
                return
            if getattr(_CALL_THREAD, "active", False):
                # Served inside a transaction call, on its thread: the report goes to its
                # owner on the thread that owns this producer (see _bounded).
                self._deferred.append(functools.partial(report, None, msg))
            else:
                report(None, msg)  # its fate is the transaction's

        return delivered

    def _fire_deferred(self) -> None:
        while self._deferred:
            self._deferred.popleft()()

    def poll(self, timeout: float = 0.0) -> int:
        self._fire_deferred()
        try:
            return int(self._client.poll(timeout))
        except Exception as exc:  # librdkafka raises a fatal error (fenced) from poll
            self._broken(exc)
            return 0

    def flush(self, timeout: float = -1) -> int:
        self._fire_deferred()
        try:
            return int(self._client.flush(timeout))
        except Exception as exc:
            self._broken(exc)
            return len(self._client)

    def _broken(self, exc: Exception) -> None:
        """The client failed for good: the open transaction aborts, and the engine replaces
        the client (:meth:`renew`) when the abort fails too."""
        if self.doomed is None:
            self.doomed = f"the transactional producer failed: {exc}"

    def __len__(self) -> int:
        return len(self._client)

    # -- transactions ---------------------------------------------------------------------------
    def init_transactions(self, timeout: float) -> None:
        """Register the ``transactional.id``, calling again within ``timeout`` while
        librdkafka says the failure is retriable (as its documentation asks): a coordinator
        that is still loading the transaction log (``COORDINATOR_LOAD_IN_PROGRESS``, seen on
        a freshly started broker) or not yet found is not a reason to refuse exactly-once."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                self._bounded("init_transactions", self._client.init_transactions, max(left, 1.0))
                return
            except TransactionCallStuck:
                raise
            except Exception as exc:
                if not retriable(exc) or left <= INIT_RETRY_PAUSE:
                    raise
                log.info("initialising transactions: %s; trying again", describe(exc))
            time.sleep(INIT_RETRY_PAUSE)

    def begin_transaction(self) -> None:
        self._client.begin_transaction()  # local: librdkafka answers at once
        self._transaction += 1
        self.doomed = None

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self._bounded(
            "send_offsets_to_transaction",
            functools.partial(self._client.send_offsets_to_transaction, offsets, metadata),
            timeout,
        )

    def commit_transaction(self, timeout: float) -> None:
        self._bounded("commit_transaction", self._client.commit_transaction, timeout)

    def abort_transaction(self, timeout: float) -> None:
        self._bounded("abort_transaction", self._client.abort_transaction, timeout)

    def _bounded(self, name: str, call: Callable[[float], None], timeout: float) -> None:
        """``call(timeout)``, given up :data:`CALL_GRACE` seconds past its own timeout.

        librdkafka does not always keep a transaction call's timeout: seen after a broker
        bounce, ``send_offsets_to_transaction`` waits without end for an answer from the group
        coordinator that never comes (its request waits for a coordinator with no deadline),
        and the thread that called it with it, for good. So the call runs on a thread of its
        own while this one waits; one that does not return in time leaves its client stuck:
        every later transaction call fails at once (:class:`TransactionCallStuck`), the
        transaction is doomed, and the engine's renewal replaces the client. The new client's
        ``init_transactions`` bumps the epoch, which fences whatever the stuck one might
        still do; the stuck call's thread ends when librdkafka lets it.

        Delivery reports that the call serves (commit and abort flush, purged records) are
        kept and fired here once it returned (or at the next poll): the sink's reports stay on
        the processing thread, as the engine's threading rule has it.
        """
        if self._stuck is not None:
            raise TransactionCallStuck(self._stuck)
        done: Future[None] = Future()

        def run() -> None:
            _CALL_THREAD.active = True
            try:
                call(timeout)
            except BaseException as exc:  # handed to the waiting thread as it is
                done.set_exception(exc)
            else:
                done.set_result(None)

        threading.Thread(target=run, name=f"offtake-{name}", daemon=True).start()
        if not wait([done], timeout + CALL_GRACE).done:
            self._stuck = (
                f"{name} did not return within {timeout + CALL_GRACE:g}s (its timeout is "
                f"{timeout:g}s); this producer is given up"
            )
            self._broken(TransactionCallStuck(self._stuck))
            raise TransactionCallStuck(self._stuck)
        self._fire_deferred()
        done.result()

    def close(self) -> None:
        """Close the current client where the client can (confluent-kafka 2.16's producers);
        a client with a stuck call is left to it (closing it would wait for that call)."""
        close = getattr(self._client, "close", None)
        if close is not None and self._stuck is None:
            close()

    def renew(self, init_timeout: float) -> None:
        """Drop the current client (what it still holds belongs to an aborted transaction)
        and start a new one with the same ``transactional.id``: a new epoch, nothing open.

        Raises what ``init_transactions`` raises; the old client is gone either way (one
        with a stuck call is destroyed when that call's thread lets go of it).
        """
        old, self._client = self._client, None
        purge = getattr(old, "purge", None)
        if purge is not None:
            purge()  # queued and in-flight records: their delivery reports say "purged"
        old.poll(0)  # fire those reports now, while their owners still expect them
        self._fire_deferred()
        del old  # librdkafka's handle is destroyed with the last reference
        self._stuck = None
        self._client = self._make()
        self.renewals += 1
        self.init_transactions(init_timeout)


class TransactionCallStuck(OfftakeError):
    """A librdkafka transaction call did not return in time; its client is given up."""
