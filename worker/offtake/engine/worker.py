"""The worker: one poll loop that consumes, dispatches, drains and shuts down.

Follow a record: :class:`~offtake.kafka.source.KafkaSource` ``consume()`` -> :meth:`_dispatch`
here -> :mod:`processing_stage` (decode, processor, retries, sink) -> :mod:`settlements` ->
the delivery mode (:mod:`delivery`: the offset tracker, then commits or a transaction).

Threading: this loop's thread owns the source (and so the consumer), the delivery mode (with
the offset tracker), the pauser and the lag gauges; rebalance and commit callbacks run on it
too (inside ``consume()``). The processing thread owns the processor, the sink and the dead-letter
producer. The two talk only through :class:`ProcessingStage`'s methods (work, current
assignments, flush and abandon requests in) and :class:`Settlements` (settled records and stop
requests out). The parts are built by :mod:`assembly` and handed in; what differs between
delivery modes (when to commit, at the in-flight bound, on revoke, on lost partitions, at
shutdown) is the :class:`DeliveryMode`'s, so nothing here asks which mode runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass

from offtake.config.spec import PipelineSpec
from offtake.engine.backpressure import InFlightGate, PartitionPauser
from offtake.engine.delivery.base import DeliveryMode
from offtake.engine.exit_codes import EXIT_FATAL, EXIT_OK, EXIT_STOPPED_ON_ERROR
from offtake.engine.lag import LagGauges
from offtake.engine.processing_stage import ProcessingStage
from offtake.engine.retry_topics import RetryRoute
from offtake.engine.settlements import Settled, Settlements
from offtake.engine.watchdog import armed as watchdog_armed
from offtake.engine.work import Work
from offtake.health import Health
from offtake.kafka.protocols import MessageLike
from offtake.kafka.source import Source, SourceFatal, StartPosition
from offtake.metrics import Metrics
from offtake.processing.base import Processor
from offtake.records import RECORD_OVERHEAD, TopicPartition
from offtake.sinks.base import Sink

log = logging.getLogger("offtake.worker")

POLL_TIMEOUT = 0.1
BUSY_POLL_TIMEOUT = 0.005
# At the in-flight bound nothing but settled records (then a commit) frees room, and the
# processing thread wakes this loop when it settles some: the wait's timeout only bounds how
# long the loop goes without looking (a wake-up every 5 ms, 200 a second, found nothing new).
AT_BOUND_WAIT = 0.02
MAX_CONSUME_GAP = 0.1  # consume() at least this often: rebalance and commit callbacks run there
MAX_BATCH = 500
# A bound held this long is a stall (the sink does not confirm): pause; before, just wait.
STALL_GRACE = 0.5
STAGE_QUEUE_TARGET = 2 * MAX_BATCH  # records queued for the processing thread: two polls
DRAIN_STEP = 0.005
# Leaving the group at shutdown gets what is left of the drain budget plus LEAVE_MARGIN (the
# revoke it triggers finds the work drained and committed), and the watchdog ends the process
# (offtake.engine.watchdog.EXIT_WATCHDOG) if the Kafka client has not returned by the budget
# plus WATCHDOG_MARGIN, both counted from the stop: inside the pod's grace period, the budget
# plus 15 s (docs/worker.md, shutdown).
LEAVE_MARGIN = 5.0
WATCHDOG_MARGIN = 10.0


@dataclass
class WorkerParts:
    """Everything a worker runs with, built by :func:`offtake.engine.assembly.build_worker`."""

    spec: PipelineSpec
    source: Source  # a consumer group's (kafka/source.py) or a share group's (share_source.py)
    stage: ProcessingStage
    settlements: Settlements
    processor: Processor
    sink: Sink
    metrics: Metrics
    health: Health
    delivery: DeliveryMode  # at-least-once or exactly-once (engine/delivery/)
    route: RetryRoute | None = None  # errors.retryTopics: which topics are retry topics


class Worker:
    """Runs one pipeline until stopped; see the module docstring for the record's path."""

    def __init__(self, parts: WorkerParts) -> None:
        self.spec = parts.spec
        self.source = parts.source
        self.stage = parts.stage
        self.settlements = parts.settlements
        self.processor = parts.processor
        self.sink = parts.sink
        self.metrics = parts.metrics
        self.health = parts.health
        self.route = parts.route
        self.delivery = parts.delivery
        self.tracker = self.delivery.tracker
        self.backpressure = InFlightGate(self.spec.limits, grace=STALL_GRACE)
        self.pauser = PartitionPauser(self.source, self.metrics)
        # Calls in flight with lanes (processor.concurrency > 1, order key or partition): each
        # partition gets a share of the in-flight bound (PartitionPauser.share). A share group
        # has no partitions of its own to pause; order none has no lanes to wait behind.
        scheduler = self.stage.scheduler
        self._shares = (
            scheduler is not None
            and scheduler.order != "none"
            and not self.spec.source.is_share_group
        )
        self.lag = LagGauges(self.source, self.tracker, self.metrics)
        self.delivery.bind(self)
        self._stop = threading.Event()
        self._stop_reason = ""
        self._exit_code = EXIT_OK
        self._assigned_once = False
        self._shutting_down = False
        # Partitions being revoked right now: records of them fetched meanwhile are not taken.
        self._revoking: frozenset[TopicPartition] = frozenset()
        self._last_consume = 0.0
        self._shutdown_deadline: float | None = None

    # -- public -------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._assigned_once and not self._shutting_down

    @property
    def stopping(self) -> threading.Event:
        """Set once a stop was requested; lets start-up waits give up early."""
        return self._stop

    def stop(self, reason: str = "stop requested") -> None:
        """Graceful stop (what SIGTERM does); safe from any thread or a signal handler."""
        if not self._stop.is_set():
            self._stop_reason = reason
        self._stop.set()

    def fail(self, code: int, reason: str) -> None:
        """Stop with an exit code other than 0; the first failure's code and reason stay."""
        if self._exit_code == EXIT_OK:
            self._exit_code = code
            log.error("%s", reason)
        self.stop(reason)

    def run(self) -> int:
        """Consume until stopped; return the process exit code."""
        retry_topics = sorted(self.route.topics) if self.route is not None else []
        self.metrics.init_topics([*self.spec.source.topics, *retry_topics])
        try:
            self.processor.open()  # processor.lifespan: before the first call
        except Exception as exc:  # nothing consumed yet: say why, and close what was built
            log.error("%s", exc)
            self.sink.close()
            self.processor.close()
            return EXIT_FATAL
        self.stage.start()
        self.source.open(self)
        log.info(
            "worker started: pipeline %s, group %s, topics %s",
            self.spec.name,
            self.spec.source.group_id,
            ",".join(self.spec.source.topics),
        )
        if retry_topics:
            log.info("retry topics: %s", ",".join(retry_topics))
        try:
            while not self._stop.is_set():
                self._iterate()
        finally:
            self._shutdown()
        return self._exit_code

    # -- the loop -------------------------------------------------------------------------
    def _iterate(self) -> None:
        self.health.heartbeat()
        paused = self.backpressure.update(
            self.tracker.inflight_messages, self.tracker.inflight_bytes, time.monotonic()
        )
        self._pause(paused)
        if self._shares:
            self._share()
        if self.pauser.held:
            self.pauser.release_due(time.time())
        self._dispatch(self._fetch(paused))
        self._apply_settled()
        self.delivery.step(time.monotonic())
        self.lag.refresh()
        state = "backpressure" if paused else ("busy" if self.tracker.inflight_messages else "idle")
        self.metrics.set_state(state)

    def _pause(self, paused: bool) -> None:
        if not paused and not self.pauser.paused:
            return  # nothing to pause and nothing paused: most iterations, a moment each
        why = (
            f" at {self.tracker.inflight_messages} in-flight record(s), "
            f"{self.tracker.inflight_bytes} bytes"
        )
        self.pauser.apply(set(self.tracker.partitions()), paused, why)

    def _share(self) -> None:
        """Stop fetching a partition whose unsettled records reach its share of the in-flight
        bound (the bound over the assigned partitions, at least a poll's worth); fetch it again
        at half of that. So every partition's keys get calls, however librdkafka orders a
        poll's records."""
        pending = self.tracker.pending()
        if not pending:
            return
        share = max(MAX_BATCH, self.spec.limits.max_in_flight_messages // len(pending))
        full = {tp for tp, n in pending.items() if n >= share}
        below = {tp for tp, n in pending.items() if n <= share // 2}
        self.pauser.share(full, below, self.tracker.consumed_to)

    def _fetch(self, paused: bool) -> list[MessageLike]:
        """Take only what the processing thread can start on soon.

        Records not taken wait in librdkafka's own bounded fetch queue. Pausing is the hard
        bound for when in-flight work piles up (a stalled sink); it is no steady-state flow
        control, because librdkafka drops a paused partition's fetched records and refetches
        them on resume, which costs most of a second each time.
        """
        mark = self.stage.progress()  # before looking: progress from here on ends a wait
        headroom = STAGE_QUEUE_TARGET - self.stage.queued()
        capacity = self.backpressure.capacity(
            self.tracker.inflight_messages, self.tracker.inflight_bytes
        )
        want = MAX_BATCH if paused else min(MAX_BATCH, capacity, headroom)
        now = time.monotonic()
        if capacity <= 0 and not paused:
            # At the in-flight bound: consume() would return records past it. The delivery mode
            # may free room (a synchronous commit); else wait for the processing thread. Held
            # long enough, the bound pauses the partitions instead (a stall).
            if not self.delivery.at_bound(now):
                self.stage.wait_for_progress(AT_BOUND_WAIT, mark)
            return []
        if want <= 0 and not paused and now - self._last_consume < MAX_CONSUME_GAP:
            self.stage.wait_for_progress(BUSY_POLL_TIMEOUT, mark)
            return []
        self._last_consume = now
        # With work in flight, finished records must be applied and committed promptly (that
        # is what frees capacity); a long wait in consume() would delay them, most of all while
        # paused, when no record can arrive to end the wait early.
        timeout = BUSY_POLL_TIMEOUT if self.tracker.inflight_messages else POLL_TIMEOUT
        try:
            return self.source.consume(want, timeout)
        except SourceFatal as exc:
            self.fail(EXIT_FATAL, str(exc))
            return []

    def _dispatch(self, messages: list[MessageLike]) -> None:
        """Hand one poll's records over as one :class:`Work` per partition.

        The records are cut into their partitions in one pass; each partition's offsets and
        sizes are then read in a comprehension, and registered with the tracker as one chunk.
        """
        runs: dict[tuple[str, int], list[MessageLike]] = {}
        last: tuple[str, int] | None = None
        run: list[MessageLike] = []
        for msg in messages:  # a poll holds runs of one partition each: one lookup per run
            where = (msg.topic() or "", msg.partition() or 0)
            if where != last:
                run = runs.setdefault(where, [])
                last = where
            run.append(msg)
        handed: list[Work] = []
        consumed: dict[str, int] = {}  # per topic: one counter update per poll, not per run
        retry_topics = self.route.topics if self.route is not None else ()
        for where, run in runs.items():
            tp = TopicPartition(*where)
            epoch = self.tracker.epoch(tp)
            if epoch is None or tp in self._revoking:
                continue  # fetched before a revoke: the new owner will consume it
            if where[0] in retry_topics:
                now_ms = time.time() * 1000
                run = [msg for msg in run if not self._not_due(msg, tp, now_ms)]
                if not run:
                    continue
            offsets = [msg.offset() or 0 for msg in run]
            size = sum([len(msg.key() or b"") + len(msg.value() or b"") for msg in run])
            ts_type, ts = run[0].timestamp()
            stamp = ts if ts_type and ts >= 0 else None
            self.tracker.register_batch(tp, offsets, size + RECORD_OVERHEAD * len(run), stamp)
            consumed[where[0]] = consumed.get(where[0], 0) + len(run)
            handed.append(Work(tp, epoch, run, offsets))
        if handed:
            self.stage.submit(handed)
        for topic, n in consumed.items():
            self.metrics.consumed.labels(topic).inc(n)

    def _not_due(self, msg: MessageLike, tp: TopicPartition, now_ms: float) -> bool:
        """A retry-topic record not yet due holds its partition: paused, fetched again later.

        So are the records behind it (they were sent later, so they are due later): while
        the partition is held, whatever the consumer still returns of it is not taken.
        """
        if tp in self.pauser.held:
            return True
        assert self.route is not None
        ts_type, ts = msg.timestamp()
        due = self.route.due_ms(tp.topic, msg.headers(), ts if ts_type else None)
        if due is None or due <= now_ms:
            return False
        offset = msg.offset() or 0
        if not self.pauser.hold(tp, offset, due / 1000):
            return False
        log.debug("%s@%d due in %.1fs: holding the partition", tp, offset, (due - now_ms) / 1000)
        return True

    def _apply_settled(self) -> None:
        """Hand what the processing thread settled to the delivery mode; act on stops."""
        settled = self.settlements.take_all()
        if settled:  # most iterations settle nothing: no Counter made for them
            done: Counter[tuple[str, str]] = Counter()
            for s in settled:
                n = self.delivery.settle(s)
                if n:
                    done[s.tp.topic, s.how] += n
                elif isinstance(s, Settled) and s.how == "failed" and self._current(s):
                    # A stale assignment's failure stops nothing: its records are consumed
                    # again (by this worker after an exactly-once rewind, or the new owner).
                    self.fail(EXIT_STOPPED_ON_ERROR, s.reason)
            for (topic, how), n in done.items():  # one counter update per kind, not per record
                self.metrics.processed.labels(topic, how).inc(n)
        for tp, epoch, until in self.settlements.take_slow_downs():
            if self.tracker.epoch(tp) == epoch and tp not in self._revoking:
                self.pauser.delay(tp, until)
        reason = self.settlements.take_stop()
        if reason is not None:
            self.fail(EXIT_STOPPED_ON_ERROR, reason)

    def _current(self, settled: Settled) -> bool:
        return self.tracker.epoch(settled.tp) == settled.epoch

    def assignment_changed(self) -> None:
        """Tell the processing thread which assignment (epoch) of each partition is current."""
        self.stage.set_current(
            {tp: e for tp in self.tracker.partitions() if (e := self.tracker.epoch(tp))}
        )
        self.metrics.assigned_partitions.set(len(self.tracker.partitions()))

    # -- the source's listener (called inside consume(), on this thread) --------------------
    def assigned(self, starts: dict[TopicPartition, StartPosition]) -> None:
        for tp, start in starts.items():
            self.tracker.assign(tp)
            if start.offset is None:
                continue
            if start.committed:
                self.tracker.committed(tp, start.offset)
            else:
                self.tracker.seed(tp, start.offset)
        self.pauser.fresh(set(starts))
        if self.backpressure.engaged:
            assigned = set(self.tracker.partitions())
            self.pauser.apply(assigned, True, " (assigned under backpressure)")
        self.assignment_changed()
        self._assigned_once = True
        self.health.set_ready(not self._shutting_down)
        self.metrics.rebalances.labels("assign").inc()
        log.info("assigned %d partition(s): %s", len(starts), ", ".join(map(str, starts)) or "none")

    def revoking(self, partitions: set[TopicPartition]) -> None:
        self.metrics.rebalances.labels("revoke").inc()
        self._revoking = frozenset(partitions)
        try:
            # The revoke that leaving the group brings at shutdown gets no second budget: the
            # shutdown drained (or spent the budget) already, and the pod's grace period runs.
            deadline = (
                self._shutdown_deadline
                if self._shutdown_deadline is not None
                else time.monotonic() + self.spec.shutdown.drain_timeout_seconds
            )
            released = self.delivery.revoking(partitions, deadline)
            log.info(
                "revoked %d partition(s)%s%s",
                len(partitions),
                ""
                if released.drained
                else " (drain budget spent: unfinished records will be redelivered)",
                ""
                if released.committed
                else " (uncommitted: their records since the last commit will be redelivered)",
            )
        finally:
            self._release(partitions)
            self._revoking = frozenset()

    def lost(self, partitions: set[TopicPartition]) -> None:
        # Another member may own these already: committing now could move its offsets.
        self.metrics.rebalances.labels("lost").inc()
        log.warning(
            "lost %d partition(s) without a clean revoke; dropping their work uncommitted",
            len(partitions),
        )
        self.abandon(partitions)
        self._release(partitions)
        self.delivery.lost(partitions)

    def committed(self, offsets: dict[TopicPartition, int] | None, error: str | None) -> None:
        self.delivery.on_commit(offsets, error)
        self.lag.refresh_soon()  # export the lag of the new committed offsets at once

    def _release(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            self.tracker.release(tp)
            self.metrics.forget_partition(tp)
            self.lag.forget(tp)
        self.pauser.forget(partitions)
        self.assignment_changed()

    # -- draining and shutdown -----------------------------------------------------------
    def abandon(self, partitions: set[TopicPartition]) -> None:
        """Drop the processing thread's and the sink's unfinished work of ``partitions``."""
        self.stage.abandon(partitions)

    def drain(self, partitions: set[TopicPartition] | None, deadline: float) -> bool:
        """Let in-flight work of ``partitions`` (all when None) finish, until the deadline."""
        while True:
            mark = self.stage.progress()  # before looking: progress from here on ends the wait
            self._apply_settled()
            if self.tracker.pending_in(partitions) == 0:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # No heartbeat here: the consumer is not polled while we wait, and /readyz should
            # say so if that lasts (health.READY_STALL_SECONDS). /healthz fails only past
            # max.poll.interval.ms, where Kafka would have expelled the member anyway.
            self.stage.request_flush(partitions)
            self.stage.wait_for_progress(min(DRAIN_STEP, left), mark)

    def _shutdown(self) -> None:
        self._shutting_down = True
        self.health.set_ready(False, "shutting down")
        budget = self.spec.shutdown.drain_timeout_seconds
        log.info(
            "shutting down (%s): draining in-flight work for up to %.1fs",
            self._stop_reason or "stopped",
            budget,
        )
        if not self._assigned_once:
            # Stopped while joining the group: the tracker is empty, so the drain and the
            # final commit below have nothing to do. Said plainly for whoever reads the log.
            log.info("stopped before the first assignment: nothing consumed, nothing committed")
        deadline = self._shutdown_deadline = time.monotonic() + budget
        try:
            # Stop fetching; keep the group until we commit. Not backpressure: say nothing.
            self.pauser.apply(set(self.tracker.partitions()), True, quiet=True)
            drained = self.drain(None, deadline)
            if not drained:
                log.warning(
                    "drain budget spent with %d record(s) unfinished: they will be redelivered",
                    self.tracker.pending_in(None),
                )
            self.delivery.end(drained)
            self.stage.abort.set()
            self.stage.close(max(0.0, deadline - time.monotonic()), join_timeout=1.0)
            self._apply_settled()
            self.delivery.final_commit(deadline)
        except Exception:
            log.exception("error during shutdown; closing the consumer")
            if self._exit_code == EXIT_OK:
                self._exit_code = EXIT_FATAL
        finally:
            self._revoking = frozenset(self.tracker.partitions())
            # Counted from the stop, not from here: the pod's grace period (the budget + 15 s)
            # runs from the SIGTERM, and the drain and final commit may have used the budget.
            left = max(0.0, deadline - time.monotonic())
            with watchdog_armed(
                left + WATCHDOG_MARGIN, "leaving the group (unsubscribe, revoke, close)"
            ):
                self.source.close(leave_timeout=left + LEAVE_MARGIN)
            # The processing thread has stopped (or gave up its join): the sink is ours now.
            self.sink.close()
            self.processor.close()
            log.info("stopped: exit code %d", self._exit_code)
