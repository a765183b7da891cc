"""The exactly-once Kafka sink: records and consumed offsets commit in one transaction.

A :class:`KafkaSink` whose producer is transactional. The engine decides when a transaction
ends (:mod:`offtake.engine.delivery.transactional`): once every record it handed over is
settled, it asks this sink, on the processing thread that owns the producer, to commit the
transaction with the consumed offsets and the consumer's group metadata (KIP-447: a worker
fenced by a newer generation cannot commit). The dead-letter queue produces through the same
producer, so dead letters are part of the same transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from offtake.errors import OfftakeError
from offtake.formats.plain import encode_value
from offtake.kafka.errors import describe
from offtake.kafka.transactional_producer import CALL_GRACE, TransactionalProducer
from offtake.records import TopicPartition
from offtake.sinks.base import OnSettled, SinkError
from offtake.sinks.kafka import KafkaSink

log = logging.getLogger("offtake.sinks.kafka")

INIT_TIMEOUT = 30.0  # init_transactions: find the coordinator, fence and abort a predecessor
CALL_MARGIN = 5.0


class TransactionFailed(OfftakeError):
    """A transaction could not be committed and was aborted (or could not even be aborted)."""


class TransactionalKafkaSink(KafkaSink):
    name = "kafka-exactly-once"

    producer: TransactionalProducer

    def __init__(
        self,
        producer: TransactionalProducer,
        topic: str,
        make_partition: Any,
        commit_timeout: float = 60.0,
        encode: Callable[[Any], bytes | None] = encode_value,
    ) -> None:
        super().__init__(producer, topic, encode)
        self._make_partition = make_partition  # (topic, partition, offset) -> client's type
        # Each librdkafka transaction call may block this long: the transaction's own timeout
        # (transaction.timeout.ms), past which the coordinator aborts it anyway.
        self.commit_timeout = commit_timeout
        self._open = False

    def start(self, on_settled: OnSettled) -> None:
        """Register the transactional.id (fencing an older producer with it) and begin."""
        super().start(on_settled)
        p = self.producer
        try:
            p.init_transactions(INIT_TIMEOUT)
        except Exception as exc:  # KafkaException: refused, timed out, not authorised
            raise SinkError(
                "spec.sink.kafka.delivery: exactly-once needs Kafka transactions, and "
                f"initialising them failed: {describe(exc)} (the broker must allow "
                "transactions for this transactional.id; transaction.timeout.ms must not exceed "
                "the broker's transaction.max.timeout.ms)"
            ) from exc
        p.begin_transaction()
        self._open = True

    def commit_transaction(self, offsets: dict[TopicPartition, int], group_metadata: Any) -> None:
        """Commit what was produced since the last commit together with ``offsets``.

        Called on the processing thread with nothing outstanding. On failure the transaction
        is aborted and :class:`TransactionFailed` raised: the engine then restarts from the
        last committed transaction rather than guess which outputs survived.
        """
        p = self.producer
        parts = [self._make_partition(tp.topic, tp.partition, o) for tp, o in offsets.items()]
        if p.doomed is not None:
            reason = p.doomed
            self.abort_transaction()
            raise TransactionFailed(f"the transaction was aborted: {reason}")
        try:
            if parts:
                p.send_offsets_to_transaction(parts, group_metadata, self.commit_timeout)
            p.commit_transaction(self.commit_timeout)
        except Exception as exc:  # KafkaException: fenced, timed out, coordinator moved...
            self.abort_transaction()
            raise TransactionFailed(f"committing the transaction failed: {describe(exc)}") from exc
        p.begin_transaction()

    @property
    def call_timeout(self) -> float:
        """The longest any one of this sink's transaction calls can keep the processing thread:
        a failed commit is send_offsets, commit and abort, each up to ``commit_timeout`` and
        the producer's grace past it (after which the producer gives the call up).

        The engine waits this long for a call's outcome: giving up earlier would leave the call
        running while the engine acted as if it had failed (it may still commit)."""
        call = self.commit_timeout + CALL_GRACE
        return max(3 * call, INIT_TIMEOUT + CALL_GRACE + call) + CALL_MARGIN

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open (False once the producer was fenced or closed)."""
        return self._open

    def abort_transaction(self, begin_next: bool = True) -> None:
        """Abort the open transaction; its records never reach read_committed readers."""
        if not self._open:
            return
        self._open = False
        p = self.producer
        try:
            p.abort_transaction(self.commit_timeout)
        except Exception as exc:  # fatal (fenced): the broker aborts it when it times out
            log.warning("aborting the transaction failed: %s", describe(exc))
            return
        if begin_next:
            p.begin_transaction()
            self._open = True

    def renew(self) -> None:
        """Replace a producer that can no longer abort or begin (fenced, or its abort failed)
        with a new one of the same transactional.id, and begin a transaction on it.

        What the old one held belonged to an aborted transaction; the engine consumes those
        records again. Raises :class:`SinkError` if the new producer cannot start.
        """
        self._open = False
        try:
            self.producer.renew(INIT_TIMEOUT)
            self.producer.begin_transaction()
        except Exception as exc:  # KafkaException: the coordinator is unreachable, refused...
            raise SinkError(
                f"exactly-once: a new transactional producer could not start: {describe(exc)}"
            ) from exc
        self._open = True
        log.warning("exactly-once: started a new transactional producer (new epoch)")

    def close(self) -> None:
        # What was not committed must not be committed later by accident; aborting it now
        # also spares read_committed readers the wait for transaction.timeout.ms.
        self.abort_transaction(begin_next=False)
        super().close()
