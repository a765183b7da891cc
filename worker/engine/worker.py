"""The worker: one poll loop that consumes, dispatches, commits, pauses and shuts down.

Follow a record: ``consume()`` here -> :mod:`processing_stage` (decode, processor, retries)
-> a sink (:mod:`offtake.sinks`) -> a completion (:mod:`completions`) -> the offset tracker
(:mod:`offsets`) -> :mod:`commits`. Only this loop's thread touches the consumer and the
tracker; other threads report through the completion queue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

from offtake.config.spec import PipelineSpec
from offtake.engine.backpressure import Backpressure
from offtake.engine.commits import Committer
from offtake.engine.completions import Completions
from offtake.engine.dead_letters import DeadLetterQueue
from offtake.engine.errors import ErrorPolicy
from offtake.engine.kafka_config import consumer_config, producer_config
from offtake.engine.offsets import OffsetTracker
from offtake.engine.oldest_record import OldestRecordProbe
from offtake.engine.processing_stage import ProcessingStage, Work
from offtake.health import Health
from offtake.kafka.protocols import ClientFactory, ConsumerLike, MessageLike
from offtake.metrics import Metrics
from offtake.processing.base import Processor
from offtake.records import TopicPartition, footprint
from offtake.sinks.base import Sink, SinkItem

log = logging.getLogger("offtake.worker")

POLL_TIMEOUT = 0.1
BUSY_POLL_TIMEOUT = 0.005
MAX_CONSUME_GAP = 0.1  # consume() at least this often: rebalance and commit callbacks run there
MAX_BATCH = 500
STAGE_QUEUE_TARGET = 2 * MAX_BATCH  # records queued for the processing thread: two polls
LAG_REFRESH_SECONDS = 1.0
EXIT_OK, EXIT_STOPPED_ON_ERROR, EXIT_FATAL = 0, 1, 3
OFFSET_STORED = -1000  # librdkafka: start from the committed offset

# librdkafka error codes the loop treats specially (confluent_kafka.KafkaError values).
_PARTITION_EOF = -191


class Worker:
    """Runs one pipeline until stopped; see the module docstring for the record's path."""

    def __init__(
        self,
        spec: PipelineSpec,
        *,
        clients: ClientFactory | None = None,
        sink: Sink | None = None,
        processor: Processor | None = None,
        metrics: Metrics | None = None,
        health: Health | None = None,
        instance_id: str | None = None,
    ) -> None:
        from offtake.engine.assembly import default_clients, make_processor, make_sink

        self.spec = spec
        self.clients = clients or default_clients()
        self.metrics = metrics or Metrics(spec.name)
        self.health = health or Health(max_poll_interval_s=300.0)
        self.instance_id = instance_id
        self.completions = Completions()
        self.tracker = OffsetTracker()
        self.backpressure = Backpressure(spec.limits)
        self._stop = threading.Event()
        self._stop_reason = ""
        self._exit_code = EXIT_OK
        self._paused: set[TopicPartition] = set()
        self._assigned_once = False
        self._shutting_down = False
        self._last_lag = 0.0
        self._oldest_seen: dict[TopicPartition, int] = {}
        self._cooperative = True
        # Partitions being revoked right now: records of them fetched meanwhile are not taken.
        self._revoking: frozenset[TopicPartition] = frozenset()
        self._last_consume = 0.0
        self.processor = processor or make_processor(spec)
        self.sink = sink or make_sink(spec, self.clients, self.metrics)
        self.dlq: DeadLetterQueue | None = None
        if spec.errors.policy == "dlq" and spec.errors.dlq is not None:
            self.dlq = DeadLetterQueue(
                self.clients.producer(producer_config(spec)), spec.errors.dlq.topic
            )
        self.policy = ErrorPolicy(
            spec.errors, self.completions, self.dlq, self.metrics, self._fail_stop
        )
        self.stage = ProcessingStage(
            self.processor,
            self.sink,
            self.policy,
            spec.source.format,
            self.completions,
            self._is_current,
            self.metrics,
            spec.errors.max_retries,
        )
        self.consumer: ConsumerLike | None = None
        self.committer: Committer | None = None
        self.oldest_probe = OldestRecordProbe(
            self._make_probe_consumer, self.clients.topic_partition
        )

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

    def run(self) -> int:
        """Consume until stopped; return the process exit code."""
        conf = consumer_config(self.spec, self.instance_id)
        conf["on_commit"] = self._on_commit
        conf.setdefault("error_cb", self._on_kafka_error)
        self._cooperative = "cooperative" in str(conf.get("partition.assignment.strategy", "")) or (
            str(conf.get("group.protocol", "")).lower() == "consumer"
        )
        self.consumer = consumer = self.clients.consumer(conf)
        self.committer = Committer(
            consumer,
            self.tracker,
            self.metrics,
            self.spec.commit.interval_seconds,
            self.spec.limits.max_in_flight_messages,
            self.clients.topic_partition,
        )
        self.metrics.init_topics(list(self.spec.source.topics))
        self.sink.start(self._on_sink_complete)
        self.stage.start()
        consumer.subscribe(
            list(self.spec.source.topics),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        log.info(
            "worker started: pipeline %s, group %s, topics %s",
            self.spec.name,
            self.spec.source.group_id,
            ",".join(self.spec.source.topics),
        )
        try:
            while not self._stop.is_set():
                self._iterate(consumer)
        finally:
            self._shutdown(consumer)
        return self._exit_code

    # -- the loop -------------------------------------------------------------------------
    def _iterate(self, consumer: ConsumerLike) -> None:
        self.health.heartbeat()
        paused = self.backpressure.update(
            self.tracker.inflight_messages, self.tracker.inflight_bytes
        )
        self._apply_pause(consumer, paused)
        messages = self._fetch(consumer, paused)
        self._dispatch(messages)
        self._service()
        assert self.committer is not None
        self.committer.maybe_commit()
        self._refresh_gauges(consumer)
        state = "backpressure" if paused else ("busy" if self.tracker.inflight_messages else "idle")
        self.metrics.set_state(state)

    def _fetch(self, consumer: ConsumerLike, paused: bool) -> list[Any]:
        """Take only what the processing thread can start on soon.

        Records not taken wait in librdkafka's own bounded fetch queue. Pausing is the hard
        bound for when in-flight work piles up (a stalled sink); it is no steady-state flow
        control, because librdkafka drops a paused partition's fetched records and refetches
        them on resume, which costs most of a second each time.
        """
        headroom = STAGE_QUEUE_TARGET - self.stage.queued()
        capacity = self.backpressure.capacity(self.tracker.inflight_messages)
        want = MAX_BATCH if paused else min(MAX_BATCH, capacity, headroom)
        now = time.monotonic()
        if want <= 0 and not paused and now - self._last_consume < MAX_CONSUME_GAP:
            self.stage.wait_for_progress(BUSY_POLL_TIMEOUT)
            return []
        self._last_consume = now
        # With work in flight, finished records must be applied and committed promptly (that
        # is what frees capacity); a long wait in consume() would delay them, most of all while
        # paused, when no record can arrive to end the wait early.
        timeout = BUSY_POLL_TIMEOUT if self.tracker.inflight_messages else POLL_TIMEOUT
        return consumer.consume(num_messages=max(1, want), timeout=timeout)

    def _service(self) -> None:
        """Let sinks and the DLQ fire callbacks, then apply finished work to the tracker."""
        self.sink.poll()
        if self.dlq is not None:
            self.dlq.poll()
        done: Counter[tuple[str, str]] = Counter()
        for c in self.completions.take_all():
            if c.outcome == "failed":
                self.tracker.fail(c.tp, c.offset, c.epoch)
            elif self.tracker.done(c.tp, c.offset, c.epoch):
                done[c.tp.topic, c.outcome] += 1
        for (topic, outcome), n in done.items():  # one counter update per kind, not per record
            self.metrics.processed.labels(topic, outcome).inc(n)

    def _dispatch(self, messages: list[Any]) -> None:
        batch: list[tuple[MessageLike, int]] = []
        consumed: Counter[str] = Counter()
        for msg in messages:
            err = msg.error()
            if err is not None:
                self._on_message_error(err)
                continue
            tp = TopicPartition(msg.topic(), msg.partition())
            epoch = self.tracker.epoch(tp)
            if epoch is None or tp in self._revoking:
                continue  # fetched before a revoke: the new owner will consume it
            ts_type, ts = msg.timestamp()
            size = footprint(msg.key(), msg.value())
            self.tracker.register(tp, msg.offset(), size, ts if ts_type and ts >= 0 else None)
            consumed[tp.topic] += 1
            batch.append((msg, epoch))
        if batch:
            self.stage.submit(Work(batch))
        for topic, n in consumed.items():
            self.metrics.consumed.labels(topic).inc(n)

    def _apply_pause(self, consumer: ConsumerLike, paused: bool) -> None:
        assigned = set(self.tracker.partitions())
        if paused:
            todo = assigned - self._paused
            if todo:
                consumer.pause([self.clients.topic_partition(t.topic, t.partition) for t in todo])
                self._paused |= todo
                log.info(
                    "backpressure: paused %d partition(s) at %d in-flight record(s), %d bytes",
                    len(todo),
                    self.tracker.inflight_messages,
                    self.tracker.inflight_bytes,
                )
        elif self._paused:
            todo = self._paused & assigned
            if todo:
                consumer.resume([self.clients.topic_partition(t.topic, t.partition) for t in todo])
                log.info("backpressure released: resumed %d partition(s)", len(todo))
            self._paused = set()
        self._paused &= assigned
        self.metrics.paused_partitions.set(len(self._paused))

    def _refresh_gauges(self, consumer: ConsumerLike) -> None:
        self.metrics.inflight_messages.set(self.tracker.inflight_messages)
        self.metrics.inflight_bytes.set(self.tracker.inflight_bytes)
        now = time.monotonic()
        if now - self._last_lag < LAG_REFRESH_SECONDS:
            return
        self._last_lag = now
        wall_ms = time.time() * 1000
        for tp in self.tracker.partitions():
            committed = self.tracker.last_committed(tp)
            try:
                marks = consumer.get_watermark_offsets(
                    self.clients.topic_partition(tp.topic, tp.partition), timeout=1.0, cached=True
                )
            except Exception:
                marks = None
            if marks is None or committed is None or marks[1] < 0:
                continue
            lag = max(0, marks[1] - committed)
            oldest = self.tracker.oldest_uncommitted_timestamp(tp)
            if oldest is None and lag:
                # Lagging with nothing of the partition in memory (not fetched yet, or paused):
                # read the record at the committed offset; until the probe answers, the last
                # oldest record seen is the best bound (its age keeps growing).
                oldest = self.oldest_probe.timestamp(tp, committed) or self._oldest_seen.get(tp)
            if oldest is not None:
                self._oldest_seen[tp] = oldest
            elif lag:
                continue  # no series yet rather than a wrong "0 seconds behind"
            seconds = max(0.0, (wall_ms - oldest) / 1000) if lag and oldest is not None else 0.0
            self.metrics.set_lag(tp, lag, seconds)

    # -- rebalance callbacks (run inside consume(), on this thread) -----------------------
    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        tps = [TopicPartition(p.topic, p.partition) for p in partitions]
        for tp in tps:
            self.tracker.assign(tp)
        if partitions:
            starts = self._start_offsets(consumer, partitions)
            # Assign explicitly (rather than letting librdkafka do it after this callback) so
            # that partitions without a committed offset start exactly where we will commit,
            # and so that partitions gained under backpressure are paused before any fetch.
            explicit = [
                self.clients.topic_partition(p.topic, p.partition, starts.get(tp, OFFSET_STORED))
                for p, tp in zip(partitions, tps, strict=True)
            ]
            if self._cooperative:
                consumer.incremental_assign(explicit)
            else:
                consumer.assign(explicit)  # eager: this is the whole new assignment
            if self.backpressure.engaged:
                consumer.pause(partitions)
                self._paused |= set(tps)
        self._assigned_once = True
        self.health.set_ready(not self._shutting_down)
        self.metrics.rebalances.labels("assign").inc()
        self.metrics.assigned_partitions.set(len(self.tracker.partitions()))
        log.info("assigned %d partition(s): %s", len(tps), ", ".join(map(str, tps)) or "none")

    def _start_offsets(self, consumer: Any, partitions: list[Any]) -> dict[TopicPartition, int]:
        """Read committed offsets; resolve ``startFrom`` for partitions that have none.

        The committed offsets make lag right before this worker commits. A partition without
        one starts at its log end (latest) or log start (earliest), and that offset is
        committed at the next commit even if no record arrives: otherwise a pipeline that
        starts at latest and restarts would skip what was produced while it was down.
        """
        try:
            found = consumer.committed(partitions, timeout=5.0)
        except Exception as exc:
            log.warning("could not read committed offsets on assign (%s); using startFrom", exc)
            return {}
        starts: dict[TopicPartition, int] = {}
        for p in found:
            tp = TopicPartition(p.topic, p.partition)
            if p.offset >= 0:
                self.tracker.committed(tp, p.offset)
                self.oldest_probe.timestamp(tp, p.offset)  # warm it: lag in seconds needs it
                continue
            try:
                low, high = consumer.get_watermark_offsets(p, timeout=5.0, cached=False)
            except Exception as exc:
                log.warning("no watermarks for %s (%s); librdkafka applies startFrom", tp, exc)
                continue
            starts[tp] = high if self.spec.source.start_from == "latest" else low
            self.tracker.seed(tp, starts[tp])
        return starts

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        tps = {TopicPartition(p.topic, p.partition) for p in partitions}
        self.metrics.rebalances.labels("revoke").inc()
        self._revoking = frozenset(tps)
        try:
            budget = self.spec.shutdown.drain_timeout_seconds
            drained = self._drain(tps, time.monotonic() + budget)
            if not drained:
                self.sink.abandon(tps)
            assert self.committer is not None
            self.committer.commit(asynchronous=False, only=tps)
            log.info(
                "revoked %d partition(s)%s",
                len(tps),
                "" if drained else " (drain budget spent: unfinished records will be redelivered)",
            )
        finally:
            self._release(tps)
            self._revoking = frozenset()

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        # Another member may own these already: committing now could move its offsets.
        tps = {TopicPartition(p.topic, p.partition) for p in partitions}
        self.metrics.rebalances.labels("lost").inc()
        log.warning(
            "lost %d partition(s) without a clean revoke; dropping their work uncommitted", len(tps)
        )
        self.sink.abandon(tps)
        self._release(tps)

    def _release(self, tps: set[TopicPartition]) -> None:
        for tp in tps:
            self.tracker.release(tp)
            self.metrics.forget_partition(tp)
            self._oldest_seen.pop(tp, None)
        self._paused -= tps
        self.metrics.assigned_partitions.set(len(self.tracker.partitions()))

    def _is_current(self, tp: TopicPartition, epoch: int) -> bool:
        return self.tracker.epoch(tp) == epoch

    # -- draining and shutdown -----------------------------------------------------------
    def _drain(self, tps: set[TopicPartition] | None, deadline: float) -> bool:
        """Let in-flight work of ``tps`` (all when None) finish, until the deadline."""
        while True:
            self._service()
            if self.tracker.pending_in(tps) == 0:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.health.heartbeat()
            if self.stage.idle():
                self.sink.drain(tps, min(0.1, left))
                if self.dlq is not None:
                    self.dlq.flush(min(0.05, left))
            else:
                time.sleep(min(0.005, left))

    def _shutdown(self, consumer: ConsumerLike) -> None:
        self._shutting_down = True
        self.health.set_ready(False, "shutting down")
        log.info(
            "shutting down (%s): draining in-flight work for up to %.1fs",
            self._stop_reason or "stopped",
            self.spec.shutdown.drain_timeout_seconds,
        )
        deadline = time.monotonic() + self.spec.shutdown.drain_timeout_seconds
        try:
            self._apply_pause(consumer, True)  # stop fetching; keep the group until we commit
            drained = self._drain(None, deadline)
            if not drained:
                log.warning(
                    "drain budget spent with %d record(s) unfinished: they will be redelivered",
                    self.tracker.pending_in(None),
                )
            self.stage.abort.set()
            self.sink.drain(None, max(0.0, deadline - time.monotonic()))
            self._service()
            assert self.committer is not None
            self.committer.commit(asynchronous=False)
        except Exception:
            log.exception("error during shutdown; closing the consumer")
            if self._exit_code == EXIT_OK:
                self._exit_code = EXIT_FATAL
        finally:
            self._revoking = frozenset(self.tracker.partitions())
            try:
                consumer.close()  # leave the group now, so the others rebalance at once
            except Exception as exc:
                log.warning("closing the consumer failed: %s", exc)
            self.stage.close(timeout=1.0)
            self.oldest_probe.close()
            self.sink.close()
            self.processor.close()
            log.info("stopped: exit code %d", self._exit_code)

    def _make_probe_consumer(self) -> ConsumerLike:
        conf = consumer_config(self.spec)
        # Its own group id, never committed to, never subscribed: it only reads single records.
        conf["group.id"] = f"{self.spec.source.group_id}.offtake-lag-probe"
        conf.pop("group.instance.id", None)
        # It reads one record per peek: without these, librdkafka would prefetch up to 100,000
        # records of the partition in the background, memory and fetches the worker never uses.
        conf.update({"queued.min.messages": 1, "fetch.message.max.bytes": 65536})
        return self.clients.consumer(conf)

    # -- callbacks from other threads -------------------------------------------------------
    def _on_sink_complete(self, item: SinkItem, error: BaseException | None) -> None:
        submitted = item.extra.get("submitted")
        if submitted is not None:
            self.metrics.sink_seconds.observe(time.monotonic() - submitted)
        if error is None:
            self.completions.put(item.tp, item.record.offset, item.epoch, "delivered")
        else:
            self.policy.give_up(item.record, item.epoch, error, item.attempts, "sink")

    def _on_commit(self, err: Any, partitions: list[Any]) -> None:
        if self.committer is not None:
            self.committer.on_commit(err, partitions)
        self._last_lag = 0.0  # export the lag of the new committed offsets at once

    def _on_kafka_error(self, err: Any) -> None:
        if getattr(err, "fatal", lambda: False)():
            self._fail(EXIT_FATAL, f"fatal Kafka error: {err}")
        else:
            log.warning("kafka: %s", err)

    def _on_message_error(self, err: Any) -> None:
        if err.code() == _PARTITION_EOF:
            return
        if err.fatal():
            self._fail(EXIT_FATAL, f"fatal Kafka error: {err.str()}")
        else:
            log.warning("consumer error: %s", err.str())

    def _fail_stop(self, reason: str) -> None:
        self._fail(EXIT_STOPPED_ON_ERROR, reason)

    def _fail(self, code: int, reason: str) -> None:
        if self._exit_code == EXIT_OK:
            self._exit_code = code
            log.error("%s", reason)
        self.stop(reason)
