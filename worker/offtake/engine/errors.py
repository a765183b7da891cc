"""What happens to a record whose in-place retries are spent: the next retry topic
(errors.retryTopics), then errors.policy (dlq | skip | stop).

Runs on the processing thread, which owns the dead-letter and retry producer; a stop is
reported to the poll loop as a "failed" settlement, never by calling into the worker.
"""

from __future__ import annotations

import logging

from offtake.config.spec import ErrorsSpec
from offtake.engine.dead_letters import DeadLetterQueue, describe_error
from offtake.engine.retry_topics import RetrySender
from offtake.engine.settlements import Settlements
from offtake.kafka.protocols import ProducerLike
from offtake.metrics import Metrics
from offtake.records import Record
from offtake.sinks.base import SinkHalt

log = logging.getLogger("offtake.errors")

MAX_BACKOFF_SECONDS = 60.0
# The longest wait between two tries of an unreachable dependency (the schema registry, the
# processor): not the records' failure, so errors.retryBackoffSeconds' schedule is cut short
# for it, and the worker notices soon that the dependency is back.
UNAVAILABLE_BACKOFF_CAP = 5.0


class ErrorPolicy:
    """Routes failed records; every path ends in exactly one settlement.

    ``attempts`` passed in count the tries on the topic the record was consumed from; a record
    from a retry topic adds those it had before (its ``offtake.attempts`` header).
    """

    def __init__(
        self,
        spec: ErrorsSpec,
        settlements: Settlements,
        dlq: DeadLetterQueue | None,
        metrics: Metrics,
        retries: RetrySender | None = None,
    ) -> None:
        self.spec = spec
        self.settlements = settlements
        self.dlq = dlq
        self.metrics = metrics
        self.retries = retries
        producers: list[ProducerLike] = []
        for p in (dlq.producer if dlq else None, retries.producer if retries else None):
            if p is not None and all(p is not q for q in producers):
                producers.append(p)
        self._producers = producers  # shared, usually: one producer for both

    def backoff(self, attempt: int) -> float:
        """Delay before retry number ``attempt`` (1-based): exponential, capped."""
        return min(float(self.spec.retry_backoff_seconds * 2 ** (attempt - 1)), MAX_BACKOFF_SECONDS)

    # -- the producers' service, on the processing thread -----------------------------------
    def poll(self) -> None:
        for p in self._producers:
            p.poll(0)

    def in_flight(self) -> int:
        """Dead letters and retry sends not yet reported on."""
        return sum(len(p) for p in self._producers)

    def flush(self, timeout: float) -> None:
        for p in self._producers:
            p.flush(timeout)

    # -- routing ------------------------------------------------------------------------------
    def exhausted(
        self, record: Record, epoch: int, error: BaseException, attempts: int, stage: str
    ) -> None:
        """In-place retries are spent (or the sink failed): the next retry topic, or the policy."""
        if isinstance(error, SinkHalt):  # the sink's, not the record's: stop, whatever the policy
            self.metrics.errors.labels(stage).inc()
            self._stop(record, epoch, error, stage, "the sink halted")
            return
        hop = self.retries.route.next_hop(record.topic) if self.retries is not None else None
        if self.retries is None or hop is None:
            self.give_up(record, epoch, error, attempts, stage)
            return
        total = self._total(record, attempts)
        self.metrics.errors.labels(stage).inc()
        self.metrics.retries.inc()

        def sent(err: BaseException | None) -> None:
            if err is None:
                self.settlements.put(record.tp, record.offset, epoch, "retried")
            else:
                self._stop(record, epoch, err, "retry")

        log.info(
            "record %s failed (attempt %d) in %s: %s; sending it to %s, due in %ds",
            record.where(),
            total,
            stage,
            describe_error(error),
            hop[0],
            hop[1],
            extra={"topic": record.topic, "partition": record.partition, "offset": record.offset},
        )
        self.retries.send(record, error, total, stage, hop, sent)

    def give_up(
        self, record: Record, epoch: int, error: BaseException, attempts: int, stage: str
    ) -> None:
        self.metrics.errors.labels(stage).inc()
        attempts = self._total(record, attempts)
        retried = self.retries is not None and self.retries.route.is_retry(record.topic)
        extra = {"topic": record.topic, "partition": record.partition, "offset": record.offset}
        if self.spec.policy == "dlq" and self.dlq is not None:
            dlq = self.dlq

            def sent(err: BaseException | None) -> None:
                if err is None:
                    self.metrics.dlq_messages.labels(record.topic).inc()
                    self.settlements.put(record.tp, record.offset, epoch, "dlq")
                else:
                    self._stop(record, epoch, err, "dlq")

            log.warning(
                "record %s failed after %d attempt(s) in %s: %s; sending it to %s",
                record.where(),
                attempts,
                stage,
                describe_error(error),
                dlq.topic,
                extra=extra,
            )
            dlq.send(record, error, attempts, stage, sent, retried=retried)
        elif self.spec.policy == "skip":
            log.warning(
                "record %s failed after %d attempt(s) in %s: %s; skipped (errors.policy=skip)",
                record.where(),
                attempts,
                stage,
                describe_error(error),
                extra=extra,
            )
            self.settlements.put(record.tp, record.offset, epoch, "skipped")
        else:
            self._stop(record, epoch, error, stage)

    def _total(self, record: Record, attempts: int) -> int:
        if self.retries is None:
            return attempts
        return attempts + self.retries.route.prior_attempts(record)

    def _stop(
        self,
        record: Record,
        epoch: int,
        error: BaseException,
        stage: str,
        why: str = "errors.policy=stop",
    ) -> None:
        reason = (
            f"record {record.where()} failed in {stage}: {type(error).__name__}: {error} "
            f"({why}: nothing at or past this offset is committed)"
        )
        self.settlements.put(record.tp, record.offset, epoch, "failed", reason)
