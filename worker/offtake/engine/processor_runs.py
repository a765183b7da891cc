"""The processor run on records at ``processor.concurrency`` 1, and an unavailable one waited out.

On the processing thread (:mod:`offtake.engine.processing_stage` cuts a Work's attempts into
calls of at most ``CHUNK`` records and routes their outcomes). A processor that raises
anything but :class:`~offtake.processing.base.ProcessorUnavailable` failed every record of
the call. One that cannot be reached (a sidecar that does not answer, ...) is not the records'
fault: no attempt is charged, readiness says so, and the call is tried again after a backoff
(capped at ``UNAVAILABLE_BACKOFF_CAP``, never shorter than the processor's own Retry-After)
while deliveries already under way keep completing. With ``processor.concurrency`` > 1 the
calls run elsewhere (:mod:`offtake.processing.calls`) and the stage asks
:meth:`ProcessorRuns.unavailable_for` how long to wait.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from offtake.engine.errors import UNAVAILABLE_BACKOFF_CAP, ErrorPolicy
from offtake.engine.parking import Attempt
from offtake.health import Health
from offtake.metrics import Metrics
from offtake.processing.base import Outcome, Processor, ProcessorUnavailable

log = logging.getLogger("offtake.processing")


class ProcessorRuns:
    """Calls the processor for the stage (see the module's docstring)."""

    def __init__(
        self,
        processor: Processor,
        policy: ErrorPolicy,
        metrics: Metrics,
        health: Health | None,
        abort: threading.Event,
        serve: Callable[[], None],
    ) -> None:
        self.processor = processor
        self.policy = policy
        self.metrics = metrics
        # Told when the processor is unavailable and when it answers again (readiness).
        self.health = health
        self.abort = abort  # the stage's: set once it gives up on queued work
        self.serve = serve  # the stage's: lets deliveries under way complete while we wait

    def run(self, todo: list[Attempt]) -> list[Outcome] | None:
        """The processor's outcomes of ``todo``, waiting out an unavailable processor; None
        once the stage aborts."""
        unavailable = 0
        while not self.abort.is_set():
            started = time.monotonic()
            try:
                outcomes = self.processor.process([r for r, _, _ in todo])
            except ProcessorUnavailable as exc:
                unavailable += 1
                delay = self.unavailable_for(exc, unavailable, len(todo))
                self.serve()  # deliveries already under way still complete meanwhile
                self.abort.wait(delay)
                continue
            except Exception as exc:  # the processor itself broke: every record failed
                outcomes = [Outcome([], exc)] * len(todo)
            if unavailable and self.health is not None:
                self.health.set_processor_unavailable(None)
            self.metrics.processing_seconds.observe(time.monotonic() - started)
            if self.abort.is_set():
                # Given up while the call ran (the drain budget was spent): the poll loop has
                # let these records go (uncommitted, or released to a share group), so sending
                # them on now would only duplicate what the next worker sends.
                return None
            return outcomes
        return None

    def unavailable_for(self, exc: ProcessorUnavailable, times: int, records: int) -> float:
        """The processor could not be reached ``times`` calls in a row: say so (readiness, the
        log) and return how long to wait before ``records`` record(s) are tried again."""
        if self.health is not None:
            self.health.set_processor_unavailable(f"processor unavailable: {exc}")
        delay = min(self.policy.backoff(times), UNAVAILABLE_BACKOFF_CAP)
        # A processor that said how long to wait (HTTP Retry-After) knows best.
        delay = max(delay, getattr(exc, "retry_after", None) or 0.0)
        log.warning(
            "processor unavailable (%s); retrying %d record(s) in %.1fs", exc, records, delay
        )
        return delay
