"""What happens to a record that failed for good: errors.policy (dlq | skip | stop).

Runs on the processing thread, which owns the dead-letter producer; a stop is reported to the
poll loop as a "failed" settlement, never by calling into the worker.
"""

from __future__ import annotations

import logging

from offtake.config.spec import ErrorsSpec
from offtake.engine.completions import Completions
from offtake.engine.dead_letters import DeadLetterQueue, describe_error
from offtake.metrics import Metrics
from offtake.records import Record

log = logging.getLogger("offtake.errors")

MAX_BACKOFF_SECONDS = 60.0


class ErrorPolicy:
    """Applies the policy once retries are spent; every path ends in exactly one completion."""

    def __init__(
        self,
        spec: ErrorsSpec,
        completions: Completions,
        dlq: DeadLetterQueue | None,
        metrics: Metrics,
    ) -> None:
        self.spec = spec
        self.completions = completions
        self.dlq = dlq
        self.metrics = metrics

    def backoff(self, attempt: int) -> float:
        """Delay before retry number ``attempt`` (1-based): exponential, capped."""
        return min(float(self.spec.retry_backoff_seconds * 2 ** (attempt - 1)), MAX_BACKOFF_SECONDS)

    def give_up(
        self, record: Record, epoch: int, error: BaseException, attempts: int, stage: str
    ) -> None:
        self.metrics.errors.labels(stage).inc()
        extra = {"topic": record.topic, "partition": record.partition, "offset": record.offset}
        if self.spec.policy == "dlq" and self.dlq is not None:
            dlq = self.dlq

            def sent(err: BaseException | None) -> None:
                if err is None:
                    self.metrics.dlq_messages.labels(record.topic).inc()
                    self.completions.put(record.tp, record.offset, epoch, "dlq")
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
            dlq.send(record, error, attempts, stage, sent)
        elif self.spec.policy == "skip":
            log.warning(
                "record %s failed after %d attempt(s) in %s: %s; skipped (errors.policy=skip)",
                record.where(),
                attempts,
                stage,
                describe_error(error),
                extra=extra,
            )
            self.completions.put(record.tp, record.offset, epoch, "skipped")
        else:
            self._stop(record, epoch, error, stage)

    def _stop(self, record: Record, epoch: int, error: BaseException, stage: str) -> None:
        reason = (
            f"record {record.where()} failed in {stage}: {type(error).__name__}: {error} "
            f"(errors.policy=stop: nothing at or past this offset is committed)"
        )
        self.completions.put(record.tp, record.offset, epoch, "failed", reason)
