"""Exactly-once commits: the consumed offsets go into the Kafka sink's transaction.

Used instead of :class:`~offtake.engine.commits.Committer`'s consumer commits when
``sink.kafka.delivery`` is ``exactly-once``. A transaction must hold exactly the records whose
offsets it commits, so the poll loop first drains (nothing handed to the processing thread is
unsettled, nothing new is handed over meanwhile); then the tracker's commit positions are the
offsets after everything the transaction produced, and the processing thread, which owns the
producer, commits them with the consumer's group metadata (KIP-447 fencing).

One transaction covers every partition, so commits here are always synchronous and whole: on
revoke too. A transaction that fails is aborted, and this committer refuses every later commit
until :meth:`resume`: the tracker still counts the aborted records as done. The worker then
consumes them again from the last commit (when the producer can go on and nothing was in
flight), or stops and starts again from the last committed transaction (exit code 3).
"""

from __future__ import annotations

import functools
import logging
import time

from offtake.engine.commits import Committer
from offtake.engine.offsets import OffsetTracker
from offtake.engine.processing_stage import ProcessingStage
from offtake.kafka.source import KafkaSource
from offtake.metrics import Metrics
from offtake.records import TopicPartition
from offtake.sinks.kafka_transactional import TransactionalKafkaSink

log = logging.getLogger("offtake.transactions")


class TransactionCommitter(Committer):
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
