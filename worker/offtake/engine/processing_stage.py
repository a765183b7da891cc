"""The processing thread: its mailbox, and the steps it runs: decode, then the processor.

One step per module: this one is the thread and the mailbox the poll loop talks to it
through; :mod:`~offtake.engine.work` makes a :class:`Work`'s records attempts (decoded,
numbered, the ones that must not run sent to the policy); :mod:`~offtake.engine.processor_runs`
runs the processor on them; :mod:`~offtake.engine.routing` sends each outcome on and turns the
sink's reports into settlements; :mod:`~offtake.engine.parking` keeps records waiting out a
delay. :mod:`~offtake.engine.fused` does a Work's common records in one pass (concurrency 1, a
plain per-record function) and hands the others to those steps.

It runs beside the poll loop so that slow user code or a slow sidecar never stops the worker
from polling (which would get it kicked out of the group). Work arrives in consumption order
and is handled in that order, so records of one partition reach the sink in offset order --
except a record being retried: it waits out its backoff parked, while the records behind it
go on (one poison record must not stall every partition for seconds). The offset tracker
still holds commits at the parked record, so nothing past it is committed before it settles.
A record whose processor raised :class:`offtake.Backpressure` ("slow down") is parked the
same way, no attempt counted, the records behind it on its partition held while the poll
loop pauses the partition. With ``errors.ordering: strict`` the records behind a parked one
are held too (with their results, if already processed) and go on, in order, once it settled.

Threading model (the rule every other module relies on):

- This thread is the only one that calls the sink (submit, poll, drain, abandon) and the
  dead-letter producer while the worker runs. Sink settlements and DLQ delivery reports
  therefore fire on this thread, and per-item state in a sink needs no lock.
- The poll loop talks to this thread only through this class's methods, which post to queues
  or set flags under ``_cond``: :meth:`submit`, :meth:`set_current`, :meth:`request_flush`,
  :meth:`abandon`, :meth:`call`, :meth:`close`. This thread reports back only through
  :class:`Settlements` (and the result of a :meth:`call`).
- Which partition assignments are current is published by the poll loop as an immutable
  mapping (:meth:`set_current`); this thread never reads the offset tracker.
- After :meth:`close` returned with the thread stopped, the sink is the poll loop's again.

With ``processor.concurrency`` > 1 (``calls`` given) the processor runs elsewhere: the
scheduler (:mod:`~offtake.engine.scheduler`) hands out one record per lane (key or partition,
``processor.order``), the calls run on the event loop or threads (:mod:`offtake.processing.calls`)
and come back through ``_finished``; this thread alone still routes outcomes and calls the
sink. A record parked for a retry or a slow-down holds its lane, not more. Calls still running
when the stage stops after an abort are abandoned: never settled, so redelivered.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

from offtake.engine.errors import ErrorPolicy
from offtake.engine.fused import FusedPass
from offtake.engine.parking import Attempt, Parking
from offtake.engine.processor_runs import ProcessorRuns
from offtake.engine.routing import Router
from offtake.engine.scheduler import Order, Scheduler
from offtake.engine.settlements import Settlements
from offtake.engine.work import Intake, Work
from offtake.formats.base import Decoder
from offtake.health import Health
from offtake.metrics import Metrics
from offtake.processing.base import Backpressure as SlowDown
from offtake.processing.base import Outcome, Processor, ProcessorUnavailable
from offtake.processing.calls import Call, Calls, Finished
from offtake.processing.function import FunctionProcessor, PassThrough
from offtake.records import TopicPartition
from offtake.sinks.base import Sink, SinkBatch

log = logging.getLogger("offtake.processing")

T = TypeVar("T")

# Records per processor call: bounds one call (a sidecar request, a function process's
# timeout covers one call), large enough to amortise a sidecar round trip. A Work's results
# still go to the sink together, as one batch: it settles once.
CHUNK = 100
# How long the idle thread sleeps before it serves the sink again while items are out: short,
# since delivery reports are what frees in-flight capacity and lets offsets be committed.
SINK_SERVICE_INTERVAL = 0.005
# The same with calls in flight (processor.concurrency > 1): each finished call wakes the
# thread and its pass serves the sink, so the timer only bounds the wait when calls are slow.
CALLS_SERVICE_INTERVAL = 0.025
IDLE_WAIT = 0.1
FLUSH_SLICE = 0.1  # one sink.drain() call while a flush is requested; the loop keeps asking


class ProcessingStage:
    def __init__(
        self,
        processor: Processor,
        sink: Sink,
        policy: ErrorPolicy,
        decoder: Decoder,
        settlements: Settlements,
        metrics: Metrics,
        max_retries: int,
        strict_ordering: bool = False,
        health: Health | None = None,
        calls: Calls | None = None,
        concurrency: int = 1,
        order: Order = "key",
        chunk: int = 1,
    ) -> None:
        # Told when the processor is unavailable and when it answers again (readiness).
        self.health = health
        self.sink = sink
        self.policy = policy
        self.settlements = settlements
        self.metrics = metrics
        self.strict = strict_ordering
        # Pass-through (no processor, format bytes) into a sink that can write consumed
        # records as they are: a poll's records of a partition go to the sink as one batch of
        # them, with no Record, Outcome or SinkItem made per record (docs/architecture.md).
        self.forwarding = (
            isinstance(processor, PassThrough) and decoder.format == "bytes" and sink.forwards
        )
        self.parking = Parking()
        # processor.concurrency > 1 (``calls`` given): calls run on ``calls``' threads or event
        # loop, the scheduler decides which record starts next, and its lanes are the holds.
        # Without it (concurrency 1): the processor runs here, one call at a time, as always.
        self.calls = calls
        # Handed out at most: the calls running, and those an executor takes to start itself
        # as others finish (Calls.ahead: the event loop's).
        self.handout = concurrency + (calls.ahead if calls is not None else 0)
        self.scheduler = Scheduler(order, self.handout * chunk) if calls is not None else None
        self.concurrency = concurrency
        self.chunk = chunk  # records per call: 1, or CHUNK for a batch function or a sidecar
        self._finished: deque[Finished] = deque()
        self._running: OrderedDict[int, tuple[float, list[Attempt]]] = OrderedDict()
        self._tokens = itertools.count()
        self._unavailable = 0  # calls in a row the processor was unavailable for
        self.router = Router(
            sink,
            policy,
            settlements,
            metrics,
            self.parking,
            lambda: self._current,
            max_retries,
            strict_ordering and calls is None,
            lanes=order if calls is not None else None,
        )
        self.abort = threading.Event()  # set to give up on queued work (drain budget spent)
        # A Work's records made attempts (engine/work.py): decoded, numbered, the ones that
        # must not run sent to the policy or held; build_worker sets its first_attempt.
        self.intake = Intake(decoder, policy, self.parking, max_retries, self.abort, self._serve)
        # The processor called at concurrency 1, an unavailable one waited out
        # (engine/processor_runs.py); the concurrent path asks it how long to wait.
        self.runs = ProcessorRuns(processor, policy, metrics, health, self.abort, self._serve)
        # Concurrency 1 and a plain per-record function: a Work's common records decoded,
        # called and made sink items in one pass (engine/fused.py), the rest as below.
        self.fused: FusedPass | None = None
        if calls is None and type(processor) is FunctionProcessor:
            parts = (self.router, self.parking, self.intake, metrics, self.abort)
            self.fused = FusedPass(decoder, processor, *parts)
        self._current: Mapping[TopicPartition, int] = MappingProxyType({})
        self._open_mailbox()
        self._thread = threading.Thread(target=self._run, name="offtake-processing", daemon=True)

    def _open_mailbox(self) -> None:
        """What the poll loop hands this thread (under ``_cond``), and the progress it waits on."""
        self._queue: deque[Work] = deque()
        self._cond = threading.Condition()
        self._progress = threading.Condition()
        self._progressed = 0  # progress made so far (under _progress): see wait_for_progress
        self._told = 0  # settlements.posted when the poll loop was last told (this thread)
        self._queued = 0
        self._busy = False
        self._closed = False
        self._flush: frozenset[TopicPartition] | None = None  # None: no flush requested
        self._flush_all = False
        self._abandon: deque[frozenset[TopicPartition]] = deque()
        self._calls: deque[tuple[Callable[[], object], Future[object]]] = deque()
        self._final_drain_until: float | None = None

    # -- called by the poll loop -----------------------------------------------------------
    def start(self) -> None:
        self.router.start()
        if self.calls is not None:
            self.calls.open(self._call_finished)
        self._thread.start()

    def _call_finished(self, finished: list[Finished]) -> None:
        """Calls finished (on the executor's thread): queue them for this stage's thread, with
        one wake-up for the list."""
        self._finished.extend(finished)
        with self._cond:
            self._cond.notify()

    def submit(self, works: list[Work]) -> None:
        """Hand over one poll's records (a :class:`Work` per partition)."""
        with self._cond:
            self._queue.extend(works)
            self._queued += sum(len(w.messages) for w in works)
            self._cond.notify()

    def set_current(self, epochs: Mapping[TopicPartition, int]) -> None:
        """Publish which assignment (epoch) of each partition is current; others are stale."""
        self._current = MappingProxyType(dict(epochs))  # a reference swap: atomic

    def request_flush(self, partitions: Collection[TopicPartition] | None) -> None:
        """Ask for the sink to be drained (these partitions, all when None) once idle."""
        with self._cond:
            if partitions is None:
                self._flush_all = True
            else:
                self._flush = frozenset(partitions) | (self._flush or frozenset())
            self._cond.notify()

    def abandon(self, partitions: Collection[TopicPartition]) -> None:
        """Drop the sink's unfinished work of these partitions, before any further sink call."""
        with self._cond:
            self._abandon.append(frozenset(partitions))
            self._cond.notify()

    def call(self, fn: Callable[[], T], timeout: float) -> T:
        """Run ``fn`` on this thread before its next task; return its result (or raise).

        For work on what this thread owns that the loop must wait for: committing the exactly-
        once sink's transaction. Raises TimeoutError if the thread did not get to it in time.
        """
        future: Future[object] = Future()
        with self._cond:
            self._calls.append((fn, future))
            self._cond.notify()
        try:
            return future.result(timeout)  # type: ignore[return-value]
        except TimeoutError:
            # Not started yet: it never will (a late commit or abort would act on a state the
            # caller has moved past). Already running: the caller knows it did not answer.
            future.cancel()
            raise

    def queued(self) -> int:
        """Records handed over and not yet started on."""
        return self._queued

    def progress(self) -> int:
        """How often the thread has made progress so far: a mark for :meth:`wait_for_progress`."""
        return self._progressed

    def wait_for_progress(self, timeout: float, since: int) -> None:
        """Block until the thread took work from its queue or settled records delivered by the
        sink (or the timeout passed); at once if it did since ``since`` (a :meth:`progress`
        mark taken before the caller looked at the queue or the in-flight count).

        Without the mark, progress made between the caller's look and its wait would be missed
        and the wait last its whole timeout: the poll loop would sit out 5 ms with room in the
        queue while the processing thread ran dry (about a quarter of its time, JSON enrich),
        and a drain would check its partitions a step late.
        """
        with self._progress:
            if since == self._progressed:
                self._progress.wait(timeout)

    def _progressed_now(self) -> None:
        with self._progress:
            self._progressed += 1
            self._progress.notify_all()

    def close(self, drain_timeout: float, join_timeout: float = 5.0) -> None:
        """Stop after a last drain of the sink (up to ``drain_timeout``); join the thread."""
        with self._cond:
            self._closed = True
            self._final_drain_until = time.monotonic() + max(0.0, drain_timeout)
            self._cond.notify()
        self._thread.join(max(0.0, drain_timeout) + join_timeout)

    # -- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # a bug here must not kill the thread silently
            log.exception("processing thread failed; stopping the worker")
            self.settlements.request_stop("internal error in the processing thread (see the log)")
        finally:
            with self._cond:
                self._busy = False
            if self.calls is not None:
                # Calls still running are abandoned: their records are not settled, so they
                # are not committed and are redelivered (the poll loop let them go).
                self.calls.close(1.0)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._has_task():
                    outstanding = self._outstanding()
                    wait = SINK_SERVICE_INTERVAL if outstanding else IDLE_WAIT
                    if outstanding and self._running:
                        wait = CALLS_SERVICE_INTERVAL  # not IDLE_WAIT's 100 ms: reports owed
                    next_due = self.parking.until_next_due(time.monotonic())
                    if next_due is not None:
                        wait = min(wait, next_due)
                    self._cond.wait(wait)
                    if outstanding or self._running:
                        # Serve the sink and the DLQ: their reports settle records. Calls in
                        # flight: keep the metrics of their age current.
                        break
                abandon = list(self._abandon)
                self._abandon.clear()
                calls = list(self._calls)
                self._calls.clear()
                if self._closed and (
                    self.abort.is_set()
                    or (not self._queue and self._calls_idle())
                    or time.monotonic() >= (self._final_drain_until or 0.0)
                ):
                    until = self._final_drain_until or time.monotonic()
                    stop = True
                else:
                    stop = False
                retries = [] if stop else self.parking.take_due(time.monotonic(), CHUNK)
                work = None
                if not stop and not retries and self._queue:
                    work = self._queue.popleft()
                    self._queued -= len(work.messages)
                flush = self._take_flush() if not stop and not work and not retries else None
                self._busy = True
            if work is not None or abandon or calls or stop or retries or flush is not None:
                # Room in the queue, or a step a waiting poll loop checks. A pass for finished
                # calls or the sink's timer tells it only of what it settled (_tell_posted):
                # the poll loop at the in-flight bound has nothing else to look at.
                self._progressed_now()
            for partitions in abandon:
                self.sink.abandon(partitions)
                self.parking.forget(partitions)
                if self.scheduler is not None:
                    self.scheduler.forget(partitions)
            for fn, future in calls:
                _run_call(fn, future)
            if self.scheduler is not None:
                self._complete()
            if stop:
                self._final_drain(until)
                return
            if self.abort.is_set():
                pass
            elif retries and self.scheduler is not None:
                self._resume(retries)
            elif retries:
                self._process(retries)
            elif work is not None:
                self._handle(work)
            elif flush is not None:
                self.sink.drain(flush.partitions, FLUSH_SLICE)
                self.policy.flush(0.05)
            if self.scheduler is not None:
                self._start_calls()
            self._serve()  # tells the poll loop of what this pass settled (a flush's too)
            with self._cond:
                self._busy = False

    def _outstanding(self) -> bool:
        """Whether the sink, the DLQ or a retry topic owes delivery reports only we can serve."""
        return bool(self.router.out) or self.policy.in_flight() > 0

    def _has_task(self) -> bool:
        return bool(
            self._queue
            or self._finished
            or self._closed
            or self._abandon
            or self._calls
            or self.parking.has_due(time.monotonic())
            or self._flush is not None
            or self._flush_all
        )

    def _take_flush(self) -> _Flush | None:
        if self._flush_all:
            self._flush_all, self._flush = False, None
            return _Flush(None)
        flush, self._flush = self._flush, None
        return None if flush is None else _Flush(flush)

    def _final_drain(self, until: float) -> None:
        """Give the sink and the DLQ what is left of the drain budget, then stop."""
        self.sink.drain(None, max(0.0, until - time.monotonic()))
        self.policy.flush(max(0.0, until - time.monotonic()))
        self._serve()

    def _serve(self) -> None:
        """Let the sink, the DLQ and retry sends fire their callbacks (on this thread)."""
        self.sink.poll()
        self.policy.poll()
        self._tell_posted()

    def _tell_posted(self) -> None:
        """Records settled (or a slow-down or a stop was asked for) since the poll loop was
        last told: a poll loop waiting at the in-flight bound can apply them (and commit, which
        frees room) now rather than when its wait times out. Nothing new: it is not woken."""
        posted = self.settlements.posted
        if posted != self._told:
            self._told = posted
            self._progressed_now()

    def _park(self, retry: list[Attempt]) -> None:
        now = time.monotonic()
        for record, epoch, attempt in retry:
            self.parking.park(record, epoch, attempt, now + self.policy.backoff(attempt - 1))

    def _is_current(self, tp: TopicPartition, epoch: int) -> bool:
        return self._current.get(tp) == epoch

    def _handle(self, work: Work) -> None:
        epoch = work.epoch
        if not self._is_current(work.tp, epoch):
            return  # its partition was revoked or lost meanwhile: not ours any more
        if self.forwarding:
            batch = SinkBatch(work.tp, epoch, work.offsets, [], work.messages, time.monotonic())
            self.router.submit(batch)
            self._serve()
            return
        if self.fused is not None and self.fused.applies(work):
            self.fused.run(work, self._general, self._route)
            self._serve()
            return
        self._general(work)

    def _general(self, work: Work) -> None:
        todo = self.intake.attempts(work)
        if todo is None:
            return  # given up while the registry was unreachable (drain budget spent)
        self._process(todo)  # one settlement per Work: _process calls the processor per CHUNK

    def _process(self, todo: list[Attempt]) -> None:
        """Run the processor on records (a call per ``CHUNK``), route the results together,
        park failures for a retry."""
        if self.scheduler is not None:
            for item in todo:
                self.scheduler.add(item)
            return  # started by _start_calls, as the scheduler allows
        outcomes: list[Outcome] = []
        for i in range(0, len(todo), CHUNK):
            done = self.runs.run(todo[i : i + CHUNK])
            if done is None:
                return  # given up (the drain budget was spent)
            outcomes.extend(done)
            self._serve()  # delivery reports keep settling earlier batches meanwhile
        if todo:
            self._route(todo, outcomes)

    def _route(self, todo: list[Attempt], outcomes: list[Outcome]) -> None:
        """Route processed records, park failures for a retry, let held records go on."""
        retry = self.router.route(todo, outcomes)
        if retry:
            self._park(retry)
        while settled := self.parking.take_settled():
            for tp in settled:
                self._release(tp)
        self._serve()

    # -- processor.concurrency > 1: calls in flight, the scheduler deciding ---------------------
    def _calls_idle(self) -> bool:
        """No call in flight and none ready to start (always, at concurrency 1)."""
        return self.scheduler is None or (not self._running and not self.scheduler.has_ready())

    def _start_calls(self) -> None:
        """Start what the scheduler hands out, up to ``concurrency`` calls in flight and the
        executor's ``ahead`` more (waiting for a slot on the event loop)."""
        scheduler, calls = self.scheduler, self.calls
        assert scheduler is not None and calls is not None
        if self.abort.is_set():
            return
        free = self.handout - len(self._running)
        # One take for every free call, cut into calls of ``chunk`` records: the calls of one
        # chunk each, in the scheduler's order, as taking a chunk at a time would make them.
        items = scheduler.take(free * self.chunk) if free > 0 else []
        if items:
            now, chunk, running, tokens = time.monotonic(), self.chunk, self._running, self._tokens
            started: list[Call] = []
            for i in range(0, len(items), chunk):
                part = items[i : i + chunk]
                token = next(tokens)
                running[token] = (now, part)
                started.append((token, [record for record, _, _ in part]))
            calls.start(started)
        self._gauge()

    def _complete(self) -> None:
        """Route the outcomes of the calls that finished, together (a sink batch per
        partition); records parked for a retry or a slow-down keep their lane, the others free
        theirs for the next record of it."""
        scheduler = self.scheduler
        assert scheduler is not None
        todo: list[Attempt] = []
        outcomes: list[Outcome] = []
        now = time.monotonic()
        while self._finished:
            token, result = self._finished.popleft()
            entry = self._running.pop(token, None)
            if entry is None:
                continue
            started, items = entry
            scheduler.returned(len(items))
            if self.abort.is_set():
                continue  # given up (the drain budget was spent): see ProcessorRuns.run
            self.metrics.processing_seconds.observe(now - started)
            if isinstance(result, ProcessorUnavailable):
                self._wait_unavailable(items, result, now)
                continue
            if isinstance(result, BaseException):  # the processor itself broke
                result = [Outcome([], result)] * len(items)
            elif self._unavailable:
                self._unavailable = 0
                if self.health is not None:
                    self.health.set_processor_unavailable(None)
            todo.extend(items)
            outcomes.extend(result)
        if not todo:
            return
        # Partition by partition, in offset order: a sink batch per partition.
        pairs = sorted(zip(todo, outcomes, strict=True), key=lambda p: (p[0][0].tp, p[0][0].offset))
        todo = [a for a, _ in pairs]
        outcomes = [o for _, o in pairs]
        retry = self.router.route(todo, outcomes)
        if retry:
            self._park(retry)
        held = {id(record) for record, _, _ in retry}
        for (record, epoch, attempt), outcome in pairs:
            if id(record) in held:
                continue
            if isinstance(outcome.error, SlowDown) and self._is_current(record.tp, epoch):
                continue  # parked by the router: its lane stays busy
            scheduler.done((record, epoch, attempt))
        # The sink is served at the end of this thread's pass, after the next calls started:
        # each poll of a producer hands the GIL to the busy event loop, and takes up to the
        # switch interval to get it back, which the next calls would wait for.

    def _wait_unavailable(
        self, items: list[Attempt], exc: ProcessorUnavailable, now: float
    ) -> None:
        """The processor could not be reached: park the call's records (no attempt charged)
        for the backoff; their lanes stay busy, the other lanes go on."""
        self._unavailable += 1
        delay = self.runs.unavailable_for(exc, self._unavailable, len(items))
        for record, epoch, attempt in items:
            self.parking.park(record, epoch, attempt, now + delay)

    def _resume(self, due: list[Attempt]) -> None:
        """Parked records that are due go back to the scheduler, still their lanes' heads."""
        scheduler = self.scheduler
        assert scheduler is not None
        for item in due:
            if self._is_current(item[0].tp, item[1]):
                scheduler.resume(item)
            else:
                scheduler.done(item)  # revoked meanwhile: not ours any more

    def _gauge(self) -> None:
        """Calls in flight, records behind a busy lane, the oldest call's age: for metrics."""
        scheduler = self.scheduler
        assert scheduler is not None
        metrics = self.metrics
        metrics.calls_in_flight.set(min(len(self._running), self.concurrency))
        metrics.records_waiting.set(scheduler.waiting)
        oldest = next(iter(self._running.values()), None)
        metrics.oldest_call_seconds.set(time.monotonic() - oldest[0] if oldest else 0.0)

    def _release(self, tp: TopicPartition) -> None:
        """strict: the parked record of ``tp`` is settled; the records behind it go on, in order.

        Runs of records already processed are routed with their results, the others are
        processed now; if one blocks the partition again, the rest wait behind it.
        """
        held = self.parking.release(tp)
        while held:
            run = [held.popleft()]
            processed = run[0][3] is not None
            while held and (held[0][3] is not None) == processed and len(run) < CHUNK:
                run.append(held.popleft())
            todo = [(r, e, a) for r, e, a, _ in run]
            if processed:
                retry = self.router.route(todo, [o for *_, o in run if o is not None])
                if retry:
                    self._park(retry)
            else:
                self._process(todo)
            if self.parking.held_again(tp, held):  # what is left waits behind that record
                return


def _run_call(fn: Callable[[], object], future: Future[object]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn())
    except BaseException as exc:  # handed to the caller, who decides what it means
        future.set_exception(exc)


@dataclass(frozen=True, slots=True)
class _Flush:
    partitions: frozenset[TopicPartition] | None  # None: every partition
