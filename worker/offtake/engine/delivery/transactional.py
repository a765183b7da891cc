"""Exactly-once: the consumed offsets commit inside the Kafka sink's transaction.

Chosen when ``sink.kafka.delivery`` is ``exactly-once`` (the sink is a
:class:`~offtake.sinks.kafka_transactional.TransactionalKafkaSink`). A transaction must hold
exactly the records whose offsets it commits, so before each commit the mode drains
everything handed over (:meth:`Loop.drain` of every partition; the loop fetches nothing
meanwhile); then the tracker's commit positions are the offsets after everything the
transaction produced, and the processing thread, which owns the producer, commits them with
the consumer's group metadata (KIP-447 fencing).

One transaction covers every partition, so commits here are always synchronous and whole: on
revoke too, and there is no separate commit at the in-flight bound (the loop waits).

A transaction that cannot commit is aborted and its records are consumed again, in process
(Kafka's transactional copier is the model), whatever the cause: a record of it failed (a
broker down past ``message.timeout.ms``), the commit was refused (a rebalance, a coordinator
moving), the drain budget ran out (what is still under way is abandoned first), or partitions
were lost. The mode rewinds every partition to its last commit (new epochs make anything of
the old ones stale) and goes on; a producer that was fenced, could not abort, or has a
transaction call that never returned (``TransactionalProducer._bounded``) is first
replaced by one with the same ``transactional.id`` and a new epoch
(:meth:`TransactionalKafkaSink.renew`). Only after :data:`MAX_RECOVERIES` transactions in a
row aborted without one committing does the worker stop (exit code 3), so that a restart
resumes from the last committed transaction.
"""

from __future__ import annotations

import functools
import logging
import time

from offtake.engine.commits import CommitBook, CommitSchedule
from offtake.engine.delivery.base import DeliveryMode, Released
from offtake.engine.exit_codes import EXIT_FATAL
from offtake.engine.offsets import OffsetTracker
from offtake.engine.processing_stage import ProcessingStage
from offtake.kafka.source import KafkaSource
from offtake.metrics import Metrics
from offtake.records import TopicPartition
from offtake.sinks.kafka_transactional import TransactionalKafkaSink

log = logging.getLogger("offtake.delivery")

# Transactions in a row that abort without one committing before the worker gives up (exit 3).
# A broker failover costs one or two; a record that can never be produced (larger than the
# topic allows) costs them all, quickly, and the exit names it.
MAX_RECOVERIES = 8
# Before consuming an aborted transaction's records again for the n-th time in a row (n >= 2),
# wait RECOVERY_BACKOFF * 2**(n-2) seconds, at most RECOVERY_BACKOFF_CAP: a broker still down
# is not hammered, and a SIGTERM meanwhile still finds most of its drain budget.
RECOVERY_BACKOFF = 0.5
RECOVERY_BACKOFF_CAP = 5.0


class TransactionCommitter:
    """Commits the sink's open transaction with the tracker's positions, on the processing
    thread (:meth:`ProcessingStage.call`); when it is due and what an acknowledgement does
    are the at-least-once committer's (:class:`CommitSchedule`, :class:`CommitBook`)."""

    def __init__(
        self,
        source: KafkaSource,
        tracker: OffsetTracker,
        metrics: Metrics,
        interval: float,
        max_in_flight: int,
        stage: ProcessingStage,
        sink: TransactionalKafkaSink,
    ) -> None:
        self.source = source  # for the group metadata the transaction commits with (KIP-447)
        self.tracker = tracker
        self.schedule = CommitSchedule(tracker, interval, max_in_flight)
        self.book = CommitBook(tracker, metrics)
        self.stage = stage
        self.sink = sink
        self.broken: str | None = None  # why the last transaction was aborted
        # A call to the processing thread timed out: until one is answered again, nothing is
        # consumed again (the unanswered call may still commit), and only a renewal can clear it.
        self.unanswered = False

    def commit(self) -> bool:
        """Commit the open transaction with every partition's position (a transaction is
        committed whole, and the loop waits for it); the caller drained."""
        if self.broken is not None:
            return False
        self.schedule.started(time.monotonic())  # the commit interval starts again
        positions = self.tracker.commit_positions()
        if not positions:
            return True  # nothing settled since the last commit, so nothing was produced
        self.book.issued(positions)
        metadata = self.source.group_metadata()
        commit = functools.partial(self.sink.commit_transaction, positions, metadata)
        try:
            self.stage.call(commit, self.sink.call_timeout)
        except Exception as exc:  # TransactionFailed, or the processing thread did not answer
            self.book.refused()
            self._unanswered(exc)
            self.broken = str(exc) or "the processing thread did not answer in time"
            return False
        self.book.acknowledged(positions)
        return True

    def recoverable(self) -> bool:
        """After a failed commit: whether the producer is in a new transaction (not fenced),
        and the processing thread answered: one that did not may still be in the call, and
        consuming again beside it could duplicate."""
        return not self.unanswered and self.sink.in_transaction

    def _unanswered(self, exc: BaseException) -> None:
        if isinstance(exc, TimeoutError):
            self.unanswered = True

    def resume(self) -> None:
        """Commit again: the worker has rewound past what the aborted transaction held."""
        self.broken = None

    def renew(self) -> bool:
        """A new producer (new epoch) with a transaction open; False if it could not start."""
        try:
            self.stage.call(self.sink.renew, self.sink.call_timeout)
        except Exception as exc:  # SinkError, or the processing thread did not answer
            self._unanswered(exc)
            log.warning("%s", str(exc) or "the processing thread did not answer in time")
            return False
        self.unanswered = False  # it answered: whatever held it is over
        return True

    def abort(self, reason: str) -> None:
        """Abort the open transaction (its records are never read_committed) and stop here."""
        if self.broken is not None:
            return
        self.broken = reason
        try:
            self.stage.call(self.sink.abort_transaction, self.sink.call_timeout)
        except Exception as exc:
            self._unanswered(exc)
            log.warning(
                "aborting the transaction failed: %s",
                str(exc) or "the processing thread did not answer in time",
            )


class Transactional(DeliveryMode):
    """Exactly-once (see the module docstring)."""

    def __init__(
        self, committer: TransactionCommitter, source: KafkaSource, drain_timeout: float
    ) -> None:
        super().__init__(committer.tracker)
        self.committer = committer
        self.source = source
        self.drain_timeout = drain_timeout  # each transaction's drain gets the drain budget
        self.aborted_in_a_row = 0  # transactions aborted since the last one that committed
        # How the last transaction ended at shutdown (end()), None before. After it there is
        # nothing to commit or recover: the processing thread, the producer's owner, has
        # stopped, so a renewal could only wait out its timeouts until the watchdog kills us.
        self.ended: bool | None = None

    def step(self, now: float) -> None:
        if self.committer.schedule.due(now):
            self._commit_transaction()

    def revoking(self, partitions: set[TopicPartition], deadline: float) -> Released:
        if self.ended is not None:
            # The revoke that leaving the group brings, after end(): its outcome stands.
            if not self.ended:
                self.loop.abandon(partitions)
            return Released(self.ended, self.ended)
        # One transaction holds every partition: commit it whole, or consume it all again.
        committed = self._commit_transaction()
        if not committed:
            self.loop.abandon(partitions)  # their records go to the partitions' next owner
        return Released(committed, committed)

    def lost(self, partitions: set[TopicPartition]) -> None:
        if self.ended is not None:
            return  # no transaction is open after end(): nothing to abort or recover
        # The open transaction holds records of these partitions and can no longer commit
        # their offsets; the records of the partitions we keep go down with it and are
        # consumed again.
        self._abort(f"{len(partitions)} partition(s) lost")
        self._recover()

    def on_commit(self, offsets: dict[TopicPartition, int] | None, error: str | None) -> None:
        self.committer.book.on_commit(offsets, error)

    def end(self, drained: bool) -> None:
        # The transaction ends while the processing thread, its producer's owner, runs.
        # Either way nothing is lost: what did not commit is consumed again by the
        # partitions' next owner, so a graceful stop still exits 0.
        if not drained:
            self.committer.abort("drain budget spent at shutdown")
            self.ended = False
            return
        self.ended = self.committer.commit()
        if not self.ended:
            log.warning(
                "exactly-once: the last transaction aborted (%s); its records go to "
                "the partitions' next owner",
                self.committer.broken,
            )

    def final_commit(self, deadline: float) -> None:
        pass  # ended in end(): the transaction held the offsets

    def _commit_transaction(self) -> bool:
        """Drain everything handed over, then commit the sink's transaction with the offsets.

        While this runs the loop fetches nothing, so the transaction holds exactly the records
        up to the committed positions. False if it aborted: then its records are consumed
        again (or, after too many aborts in a row, the worker stops).
        """
        deadline = time.monotonic() + self.drain_timeout
        if not self.loop.drain(None, deadline):
            self._abort("records were still unfinished when the drain budget ran out")
        elif self.committer.commit():
            self.aborted_in_a_row = 0
            return True
        self._recover()
        return False

    def _abort(self, reason: str) -> None:
        """Abort with what is still under way dropped first: the processing thread takes the
        abandon before the abort, so nothing of it reaches the producer afterwards."""
        self.loop.abandon(set(self.tracker.partitions()))
        self.committer.abort(reason)

    def _recover(self) -> None:
        """After an abort: go on in process on a producer that can, or stop (see module)."""
        while True:
            self.aborted_in_a_row += 1
            if self.aborted_in_a_row > MAX_RECOVERIES:
                self._failed(f"{MAX_RECOVERIES} transactions in a row aborted")
                return
            if self.aborted_in_a_row > 1:
                backoff = RECOVERY_BACKOFF * 2 ** (self.aborted_in_a_row - 2)
                time.sleep(min(RECOVERY_BACKOFF_CAP, backoff))
            if self.committer.recoverable() or self.committer.renew():
                break
            # No producer now (the coordinator unreachable): again, after a longer wait.
        self._consume_aborted_again()

    def _consume_aborted_again(self) -> None:
        """After an abort with nothing in flight: rewind every partition to its last commit.

        The abort took the output of every record consumed since the last commit with it.
        Those records are consumed again: new epochs make anything of the old ones stale, and
        the consumer seeks back to the oldest uncommitted record.
        """
        log.warning(
            "exactly-once: transaction aborted (%s); consuming its records again",
            self.committer.broken,
        )
        for tp in self.tracker.partitions():
            restart = self.tracker.oldest_uncommitted(tp)
            self.tracker.renew(tp)
            if restart is not None:
                self.source.seek(tp, restart)
        self.loop.assignment_changed()
        self.committer.resume()

    def _failed(self, why: str) -> None:
        self.loop.fail(
            EXIT_FATAL,
            f"exactly-once: {why}, the last because: {self.committer.broken}; stopping so "
            "that a restart resumes from the last committed transaction",
        )
