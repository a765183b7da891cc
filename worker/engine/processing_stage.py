"""The processing thread: decode, run the processor with retries, hand results to the sink.

It runs beside the poll loop so that slow user code or a slow sidecar never stops the worker
from polling (which would get it kicked out of the group). Work arrives in consumption order
and is handled in that order, so records of one partition reach the sink in offset order --
except a record being retried: it waits out its backoff parked, while the records behind it
go on (one poison record must not stall every partition for seconds). The offset tracker
still holds commits at the parked record, so nothing past it is committed before it is done.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from offtake.engine.completions import Completions
from offtake.engine.errors import ErrorPolicy
from offtake.kafka.protocols import MessageLike
from offtake.metrics import Metrics
from offtake.processing.base import Outcome, Processor, ProcessorUnavailable
from offtake.processing.decode import to_record
from offtake.records import Record, TopicPartition
from offtake.sinks.base import Sink, SinkItem

log = logging.getLogger("offtake.processing")

UNAVAILABLE_BACKOFF_CAP = 5.0
# Records per processor call: small enough that results (and so commits) flow steadily
# instead of in bursts of a whole poll batch, large enough to amortise a sidecar round trip.
CHUNK = 100


@dataclass(slots=True)
class Work:
    messages: list[tuple[MessageLike, int]]  # message and the epoch of its partition's assignment


class ProcessingStage:
    def __init__(
        self,
        processor: Processor,
        sink: Sink,
        policy: ErrorPolicy,
        fmt: str,
        completions: Completions,
        is_current: Callable[[TopicPartition, int], bool],
        metrics: Metrics,
        max_retries: int,
    ) -> None:
        self.processor = processor
        self.sink = sink
        self.policy = policy
        self.fmt = fmt
        self.completions = completions
        self.is_current = is_current
        self.metrics = metrics
        self.max_retries = max_retries
        self.abort = threading.Event()  # set to give up on queued work (drain budget spent)
        self._queue: deque[Work] = deque()
        # Records waiting out a retry backoff: (due, tiebreak, record, epoch, next attempt).
        self._parked: list[tuple[float, int, Record, int, int]] = []
        self._tiebreak = itertools.count()
        self._cond = threading.Condition()
        self._progress = threading.Condition()
        self._queued = 0
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="offtake-processing", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, work: Work) -> None:
        with self._cond:
            self._queue.append(work)
            self._queued += len(work.messages)
            self._cond.notify()

    def queued(self) -> int:
        """Records handed over and not yet started on."""
        return self._queued

    def wait_for_progress(self, timeout: float) -> None:
        """Block until the thread took work from its queue (or the timeout passed)."""
        with self._progress:
            self._progress.wait(timeout)

    def idle(self) -> bool:
        with self._cond:
            return not self._queue and not self._busy and not self._parked

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed and not self._due():
                    self._cond.wait(self._until_next_due())
                if self._closed and (not self._queue or self.abort.is_set()):
                    return
                retries = self._take_due()
                work = self._queue.popleft() if self._queue and not retries else None
                if work is not None:
                    self._queued -= len(work.messages)
                self._busy = True
            with self._progress:
                self._progress.notify_all()
            try:
                if self.abort.is_set():
                    pass
                elif retries:
                    self._process(retries)
                elif work is not None:
                    self._handle(work)
            except Exception:  # a bug here must not kill the thread silently
                log.exception("processing thread failed on a batch; stopping the worker")
                self.policy.request_stop("internal error in the processing thread (see the log)")
            finally:
                with self._cond:
                    self._busy = False

    def _due(self) -> bool:
        return bool(self._parked) and self._parked[0][0] <= time.monotonic()

    def _until_next_due(self) -> float | None:
        return max(0.0, self._parked[0][0] - time.monotonic()) if self._parked else None

    def _take_due(self) -> list[tuple[Record, int, int]]:
        now = time.monotonic()
        out: list[tuple[Record, int, int]] = []
        while self._parked and self._parked[0][0] <= now and len(out) < CHUNK:
            _, _, record, epoch, attempt = heapq.heappop(self._parked)
            out.append((record, epoch, attempt))
        return out

    def _park(self, retry: list[tuple[Record, int, int]]) -> None:
        with self._cond:
            for record, epoch, attempt in retry:
                due = time.monotonic() + self.policy.backoff(attempt - 1)
                heapq.heappush(self._parked, (due, next(self._tiebreak), record, epoch, attempt))
            self._cond.notify()

    def _handle(self, work: Work) -> None:
        todo: list[tuple[Record, int, int]] = []
        for msg, epoch in work.messages:
            record, decode_error = to_record(msg, self.fmt)
            if not self.is_current(record.tp, epoch):
                continue  # its partition was revoked or lost meanwhile: not ours any more
            if decode_error is not None:
                self.policy.give_up(record, epoch, decode_error, 1, "decode")
            else:
                todo.append((record, epoch, 1))
        for i in range(0, len(todo), CHUNK):
            self._process(todo[i : i + CHUNK])

    def _process(self, todo: list[tuple[Record, int, int]]) -> None:
        """Run the processor on records, route results, park failures for a retry."""
        unavailable = 0
        while todo and not self.abort.is_set():
            started = time.monotonic()
            try:
                outcomes = self.processor.process([r for r, _, _ in todo])
            except ProcessorUnavailable as exc:
                unavailable += 1
                delay = min(self.policy.backoff(unavailable), UNAVAILABLE_BACKOFF_CAP)
                # A processor that said how long to wait (HTTP Retry-After) knows best.
                delay = max(delay, getattr(exc, "retry_after", None) or 0.0)
                log.warning(
                    "processor unavailable (%s); retrying %d record(s) in %.1fs",
                    exc,
                    len(todo),
                    delay,
                )
                self.abort.wait(delay)
                continue
            except Exception as exc:  # the processor itself broke: every record failed
                outcomes = [Outcome([], exc)] * len(todo)
            self.metrics.processing_seconds.observe(time.monotonic() - started)
            retry = self._route(todo, outcomes)
            if retry:
                self._park(retry)
            # Serve the sink's confirmations here too: this thread holds the GIL already, so
            # delivery callbacks cost no hand-over to the poll thread (that thread polls the
            # sink as well, for when this one is idle).
            self.sink.poll()
            return

    def _route(
        self, todo: list[tuple[Record, int, int]], outcomes: list[Outcome]
    ) -> list[tuple[Record, int, int]]:
        """Send results on; return the records to retry (with their next attempt number)."""
        retry: list[tuple[Record, int, int]] = []
        for (record, epoch, attempts), outcome in zip(todo, outcomes, strict=True):
            if not self.is_current(record.tp, epoch):
                continue
            if outcome.ok:
                self._to_sink(record, epoch, outcome, attempts)
            elif outcome.retriable and attempts <= self.max_retries:
                self.metrics.errors.labels("process").inc()
                self.metrics.retries.inc()
                retry.append((record, epoch, attempts + 1))
            else:
                assert outcome.error is not None
                self.policy.give_up(record, epoch, outcome.error, attempts, "process")
        return retry

    def _to_sink(self, record: Record, epoch: int, outcome: Outcome, attempts: int) -> None:
        if not outcome.values:
            self.completions.put(record.tp, record.offset, epoch, "dropped")
            return
        item = SinkItem(record, outcome.values, epoch, attempts)
        item.extra["submitted"] = time.monotonic()
        try:
            self.sink.submit(item)
        except Exception as exc:
            self.policy.give_up(record, epoch, exc, attempts, "sink")
