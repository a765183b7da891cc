"""Exactly-once: the consumed offsets commit inside the Kafka sink's transaction.

Chosen when ``sink.kafka.delivery`` is ``exactly-once`` (the sink is a
:class:`~offtake.sinks.kafka_transactional.TransactionalKafkaSink`). A transaction must hold
exactly the records whose offsets it commits, so before each commit the policy drains
everything handed over (:meth:`Loop.drain` of every partition; the loop fetches nothing
meanwhile); then the tracker's commit positions are the offsets after everything the
transaction produced, and the processing thread, which owns the producer, commits them with
the consumer's group metadata (KIP-447 fencing).

One transaction covers every partition, so commits here are always synchronous and whole: on
revoke too, and there is no separate commit at the in-flight bound (the loop waits). A
transaction that fails is aborted, and :class:`TransactionCommitter` refuses every later
commit until :meth:`TransactionCommitter.resume`: the tracker still counts the aborted
records as done. The policy then consumes them again from the last commit (when the producer
can go on and nothing was in flight), or stops the worker, which starts again from the last
committed transaction (exit code 3). Losing partitions aborts the open transaction too.
"""

from __future__ import annotations

import functools
import logging
import time

from offtake.engine.commits import Committer
from offtake.engine.delivery.base import DeliveryPolicy, Released
from offtake.engine.exit_codes import EXIT_FATAL
from offtake.engine.offsets import OffsetTracker
from offtake.engine.processing_stage import ProcessingStage
from offtake.kafka.source import KafkaSource
from offtake.metrics import Metrics
from offtake.records import TopicPartition
from offtake.sinks.kafka_transactional import TransactionalKafkaSink

log = logging.getLogger("offtake.delivery")


class TransactionCommitter(Committer):
    """Commits the sink's open transaction with the tracker's positions, on the processing
    thread (:meth:`ProcessingStage.call`); the commit interval and the acknowledgement
    bookkeeping are the at-least-once :class:`Committer`'s."""

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
        super().__init__(source, tracker, metrics, interval, max_in_flight)
        self.stage = stage
        self.sink = sink
        self.broken: str | None = None  # why the last transaction was aborted

    def commit(self, asynchronous: bool, only: set[TopicPartition] | None = None) -> bool:
        """Commit the open transaction with every partition's position; the caller drained.

        ``asynchronous`` and ``only`` are ignored: a transaction is committed whole, and the
        loop waits for it.
        """
        if self.broken is not None:
            return False
        self._last = time.monotonic()  # the commit interval starts again, as in maybe_commit
        positions = self.tracker.commit_positions()
        if not positions:
            return True  # nothing settled since the last commit, so nothing was produced
        now = time.monotonic()
        for tp in positions:
            self._issued.setdefault(tp, now)
        metadata = self.source.group_metadata()
        commit = functools.partial(self.sink.commit_transaction, positions, metadata)
        try:
            self.stage.call(commit, self.sink.commit_timeout + 5.0)
        except Exception as exc:  # TransactionFailed, or the processing thread did not answer
            self.metrics.commits.labels("failure").inc()
            self.broken = str(exc) or type(exc).__name__
            return False
        self.on_commit(positions, None)
        return True

    def recoverable(self) -> bool:
        """After a failed commit: whether the producer is in a new transaction (not fenced)."""
        return self.sink.in_transaction

    def resume(self) -> None:
        """Commit again: the worker has rewound past what the aborted transaction held."""
        self.broken = None

    def abort(self, reason: str) -> None:
        """Abort the open transaction (its records are never read_committed) and stop here."""
        if self.broken is not None:
            return
        self.broken = reason
        try:
            self.stage.call(self.sink.abort_transaction, self.sink.commit_timeout + 5.0)
        except Exception as exc:
            log.warning("aborting the transaction failed: %s", exc)


class Transactional(DeliveryPolicy):
    """Exactly-once (see the module docstring)."""

    def __init__(
        self, committer: TransactionCommitter, source: KafkaSource, drain_timeout: float
    ) -> None:
        super().__init__(committer.tracker)
        self.committer = committer
        self.source = source
        self.drain_timeout = drain_timeout  # each transaction's drain gets the drain budget

    def step(self, now: float) -> None:
        if self.committer.due(now):
            self._commit_transaction()

    def revoking(self, partitions: set[TopicPartition], deadline: float) -> Released:
        drained = self._commit_transaction()  # one transaction holds every partition
        if not drained:
            self.loop.abandon(partitions)
        return Released(drained, True)

    def lost(self, partitions: set[TopicPartition]) -> None:
        # The open transaction holds records of these partitions and can no longer commit
        # their offsets; the records of the partitions we keep go down with it.
        self.committer.abort(f"{len(partitions)} partition(s) lost")
        self._failed()

    def on_commit(self, offsets: dict[TopicPartition, int] | None, error: str | None) -> None:
        self.committer.on_commit(offsets, error)

    def end(self, drained: bool) -> None:
        # The transaction ends while the processing thread, its producer's owner, runs.
        # Either way nothing is lost: what did not commit is consumed again by the
        # partitions' next owner, so a graceful stop still exits 0.
        if not drained:
            self.committer.abort("drain budget spent at shutdown")
        elif not self.committer.commit(asynchronous=False):
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
        up to the committed positions. False if it failed: then the records of the aborted
        transaction are consumed again, or, if that cannot be done safely, the worker stops.
        """
        deadline = time.monotonic() + self.drain_timeout
        if not self.loop.drain(None, deadline):
            # Work still under way could reach the producer after the abort: stop instead.
            self.committer.abort("records were still unfinished when the drain budget ran out")
        elif self.committer.commit(asynchronous=False):
            return True
        elif self.committer.recoverable():
            self._consume_aborted_again()
            return False
        self._failed()
        return False

    def _consume_aborted_again(self) -> None:
        """After an abort with nothing in flight: rewind every partition to its last commit.

        A commit refused for a reason that does not fence the producer (most often a rebalance
        that began meanwhile: "Specified group generation id is not valid") aborted the
        transaction, and with it the output of every record consumed since the last commit.
        Those records are consumed again: new epochs make anything of the old ones stale, and
        the consumer seeks back to the oldest uncommitted record.
        """
        log.warning(
            "exactly-once: transaction aborted (%s); consuming its records again",
            self.committer.broken,
        )
        for tp in self.tracker.partitions():
            restart = self.tracker.oldest_uncommitted(tp)
            committed = self.tracker.last_committed(tp)
            self.tracker.assign(tp)
            if committed is not None:
                self.tracker.committed(tp, committed)
            if restart is not None:
                self.source.seek(tp, restart)
        self.loop.assignment_changed()
        self.committer.resume()

    def _failed(self) -> None:
        self.loop.fail(
            EXIT_FATAL,
            f"exactly-once: transaction aborted ({self.committer.broken}); stopping so "
            "that a restart resumes from the last committed transaction",
        )
