"""SparkSink: bounded batches per partition, one background thread running their Spark jobs.

The engine thread calls ``submit`` and ``poll``; neither waits for Spark. Closed batches queue
(a batch closed behind a queued one of its partition joins it, within the bounds) for a single
job thread (one job at a time keeps a small worker's cores for consuming, and
keeps each partition's batches in offset order, which the replacement rule of writers.py relies on).
Settlements are handed back to the engine thread: ``poll`` and ``drain`` settle each finished
batch (one partition's records, possibly of several submitted batches), so the engine's
callback never runs concurrently with its own loop.

A job that fails is retried with exponential backoff up to ``errors.maxRetries`` times; then
every record of the batch fails with a :class:`SinkError` naming the batch, and the engine
applies ``errors.policy``. Nothing of a batch is settled as written unless its job succeeded.

A record whose field names cannot be column names (identifiers.py: anyone who produces to the
source topic chooses them, and they reach SQL and Spark expressions) fails in ``submit``
with an :class:`UnsafeName` naming the field, before it joins a batch: the engine applies
``errors.policy`` to that record alone, and its batch lands without it. A record whose writer
schema the registry refuses to the pipeline (401/403 for that id while it answers the
pipeline's other requests: schema_columns) fails the same way, when its job starts; a
registry that refuses every id, or does not answer, is an outage as below.

A job that failed because the sink could not be reached (the database stopped, the Spark
Connect server gone: ``errors.unavailable``) is an outage, not a bad batch: it is retried
without counting an attempt, backing off up to ``UNAVAILABLE_BACKOFF_CAP`` seconds, for as
long as the outage lasts. Meanwhile the engine's in-flight limits stop consumption
(backpressure), so nothing is dead-lettered for an outage and memory stays bounded. A Spark
Connect session the client closed (the server restarted and forgot it) is replaced by a new
one before the next attempt.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from typing import Any

import pyarrow as pa

from offtake.config.spec import SCHEMA_FORMATS, PipelineSpec, SparkSinkSpec
from offtake.metrics import Metrics
from offtake.records import TopicPartition
from offtake.sinks.base import OnSettled, Sink, SinkBatch, SinkError, SinkHalt, SinkItem
from offtake.sinks.spark.batching import Batch, Batcher, BatchId
from offtake.sinks.spark.columns import column_name
from offtake.sinks.spark.errors import describe, refused_credentials, unavailable
from offtake.sinks.spark.identifiers import NameCheck, dialect_of
from offtake.sinks.spark.rows import batch_table
from offtake.sinks.spark.schema_columns import TypedColumns, existing_value_types
from offtake.sinks.spark.session import create_session, session_config, token_refused
from offtake.sinks.spark.transform import make_transform
from offtake.sinks.spark.writers import (
    BATCH_COLUMN,
    BatchAbandoned,
    Writer,
    check_jdbc_table,
    make_writer,
)

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 60.0
# Short, so work resumes within seconds of the sink coming back (each try is one cheap call).
UNAVAILABLE_BACKOFF_CAP = 5.0
STOP_JOIN_SECONDS = 30.0

Finished = tuple[Batch, BaseException | None]


class SparkSink(Sink):
    """The ``sink.spark`` of a pipeline; see the module docstring."""

    name = "spark"

    def __init__(
        self,
        spec: PipelineSpec,
        metrics: Metrics,
        session: Any | None = None,
        clock: Callable[[], float] = time.monotonic,
        writer: Writer | None = None,
        schema_registry: Any = None,
    ) -> None:
        """``schema_registry``: the registry client of a schema'd source (default: one for
        ``source.schemaRegistry``)."""
        super().__init__()
        if spec.sink.spark is None:
            raise ValueError("sink.spark: SparkSink needs a spark sink spec")
        self.spec: SparkSinkSpec = spec.sink.spark
        self.metrics = metrics
        self.max_retries = spec.errors.max_retries
        self.backoff = spec.errors.retry_backoff_seconds
        self.value_format = spec.source.format
        self.session_config = session_config(self.spec, spec.name, spec.namespace)
        self._pipeline = spec.name
        # Load the transform now: a wrong module:callable is a configuration error at start,
        # not a failure of every batch.
        self.transform = make_transform(self.spec.transform, self.spec.sql)
        check_jdbc_table(self.spec)  # pasted into statements: refused now, not per batch
        self.typed = _typed_columns(spec, schema_registry)
        jdbc_url = self.spec.jdbc.url if self.spec.jdbc is not None else None
        self.names = NameCheck(dialect_of(self.spec.format, jdbc_url), column_name)
        self._halted: SinkHalt | None = None
        self._seeded = False  # typed: the table's existing columns read (once, first batch)
        self._session = session
        self._owns_session = session is None
        self._writer: Writer | None = writer
        self._owns_writer = writer is None
        self._batcher = Batcher(self.spec.batch, clock)
        self._cond = threading.Condition()
        self._queue: deque[Batch] = deque()
        self._running: list[Batch] = []  # the batches of the job running now
        self._finished: deque[Finished] = deque()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.session_ready = threading.Event()
        self.session_seconds: float | None = None

    # -- the engine's calls ---------------------------------------------------------------
    def start(self, on_settled: OnSettled) -> None:
        super().start(on_settled)
        self._thread = threading.Thread(target=self._run, name="offtake-spark-jobs", daemon=True)
        self._thread.start()

    def submit(self, batch: SinkBatch) -> None:
        # A record with a name Spark cannot use (UnsafeName) fails at once, alone: the engine
        # applies errors.policy to it, and its neighbours join the batches.
        taken: list[SinkItem] = []
        refused: list[SinkItem] = []
        errors: dict[int, BaseException] = {}
        for item in batch.items:
            try:
                for value in item.values:
                    self.names.check(value, item.record.where())
            except Exception as exc:
                errors[len(refused)] = exc
                refused.append(item)
            else:
                taken.append(item)
        with self._cond:
            for item in taken:
                closed = self._batcher.add(item)
                if closed:
                    self._enqueue(closed)
        if refused:
            self.settle(SinkBatch.of(refused, batch.submitted), errors)

    def poll(self) -> None:
        with self._cond:
            due = self._batcher.due()
            if due:
                self._enqueue(due)
        self._fire()

    def drain(self, partitions: Collection[TopicPartition] | None, timeout: float) -> bool:
        deadline = time.monotonic() + max(0.0, timeout)
        wanted = None if partitions is None else set(partitions)
        with self._cond:
            closed = self._batcher.close(wanted)
            if closed:
                self._enqueue(closed)
            while self._busy(wanted):
                left = deadline - time.monotonic()
                if left <= 0 or not self._alive():
                    break
                self._cond.wait(left)
        self._fire()
        with self._cond:
            return not self._busy(wanted) and not self._finished_of(wanted)

    def abandon(self, partitions: Collection[TopicPartition]) -> int:
        """Forget the unfinished work of partitions this worker no longer owns.

        Drops their open and queued batches without completing them, and stops a running
        batch of theirs before its swap: once another worker owns a partition, a late write
        from here could replace rows that worker already committed. Returns items dropped.
        """
        tps = set(partitions)
        dropped = 0
        with self._cond:
            for batch in self._batcher.close(tps):
                dropped += len(batch)
            kept: deque[Batch] = deque()
            for batch in self._queue:
                if batch.tp in tps:
                    dropped += len(batch)
                else:
                    kept.append(batch)
            self._queue = kept
            for batch in self._running:
                if batch.tp in tps:
                    batch.abandoned = True
                    dropped += len(batch)
            remaining: deque[Finished] = deque()
            for batch, error in self._finished:
                if batch.tp in tps:
                    dropped += len(batch)
                else:
                    remaining.append((batch, error))
            self._finished = remaining
            self._cond.notify_all()
        return dropped

    def close(self) -> None:
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(STOP_JOIN_SECONDS)
        if self._owns_session and self._session is not None:
            try:
                self._session.stop()
            except Exception as exc:
                log.warning("stopping the Spark session failed: %s", exc)
            self._session = None

    # -- inside the sink ------------------------------------------------------------------
    def _enqueue(self, batches: list[Batch]) -> None:
        for batch in batches:
            if not self._merged_into_queued(batch):
                self._queue.append(batch)
        self._cond.notify_all()

    def _merged_into_queued(self, batch: Batch) -> bool:
        """Append ``batch`` to the newest queued batch of its partition if it follows it and
        both fit ``maxRecords`` and ``maxBytes`` together.

        While a job runs, the time bound keeps closing small batches behind it; queued
        separately, each would pay a Spark job's fixed cost (seconds on a busy machine). A
        queued batch has not started, so growing it changes nothing already written, and the
        result is what the batcher would have cut without the time bound.
        """
        bounds = self.spec.batch
        for queued in reversed(self._queue):
            if queued.tp != batch.tp:
                continue
            fits = (
                queued.epoch == batch.epoch
                and batch.items[0].record.offset > queued.items[-1].record.offset
                and len(queued.items) + len(batch.items) <= bounds.max_records
                and queued.nbytes + batch.nbytes <= bounds.max_bytes
            )
            if fits:
                queued.items.extend(batch.items)
                queued.nbytes += batch.nbytes
            return fits  # only the partition's newest queued batch: offsets stay in order
        return False

    def _busy(self, tps: set[TopicPartition] | None) -> bool:
        def mine(b: Batch) -> bool:
            return tps is None or b.tp in tps

        return any(mine(b) for b in self._running) or any(mine(b) for b in self._queue)

    def _finished_of(self, tps: set[TopicPartition] | None) -> bool:
        return any(tps is None or b.tp in tps for b, _ in self._finished)

    def _alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _fire(self) -> None:
        """Settle finished batches on the caller's (the engine's) thread."""
        with self._cond:
            finished = list(self._finished)
            self._finished.clear()
        for batch, error in finished:
            failed = {} if error is None else dict.fromkeys(range(len(batch.items)), error)
            self.settle(SinkBatch.of(batch.items, batch.opened_at), failed)

    def _run(self) -> None:
        try:
            # Start the JVM (or reach the server) before the first batch closes.
            self._ensure_session()
        except Exception as exc:
            log.error("Spark session could not start (each batch will try again): %s", exc)
        while not self._stopping.is_set():
            with self._cond:
                while not self._queue and not self._stopping.is_set():
                    self._cond.wait(1.0)
                if self._stopping.is_set():
                    return
                job = self._running = self._next_job()
            outcomes = self._run_with_retries(job)
            with self._cond:
                self._running = []
                self._finished.extend((b, e) for b, e in outcomes if not b.abandoned)
                self._cond.notify_all()

    def _session_gone(self) -> bool:
        """Our Connect session was closed by its client: the server no longer knows it."""
        return self._owns_session and bool(getattr(self._session, "is_stopped", False))

    def _ensure_session(self) -> Any:
        if self._session_gone():
            # A Spark Connect client closes its session when the server no longer knows it
            # (the server restarted); every call then fails with NO_ACTIVE_SESSION. Start anew.
            log.warning("the Spark Connect session was closed; opening a new one")
            self._session = None
            if self._owns_writer:
                self._writer = None
        if self._session is None:
            began = time.monotonic()
            self._session = create_session(self.session_config)
            self.session_seconds = time.monotonic() - began
            log.info("Spark session ready in %.1fs", self.session_seconds)
        if self._writer is None:
            self._writer = make_writer(self.spec, self._session)
        self.session_ready.set()
        return self._session

    def _next_job(self) -> list[Batch]:
        """The batches of the next Spark job (under the lock; the queue is not empty).

        With a writer that combines batches (and no transform, which must see one batch at a
        time) every queued batch: one job's fixed cost for all of them, including a
        partition's short tail batch behind a full one, which alone would cost as much as a
        full one. The writer moves them into place in the job's order, which is the queue's,
        so each partition's batches land in offset order. What can queue is bounded by
        ``limits`` (the engine pauses partitions beyond them). Otherwise the oldest batch.
        """
        if self.transform is None and self._writer is not None and self._writer.combines_batches:
            job = list(self._queue)
            self._queue.clear()
            return job
        return [self._queue.popleft()]

    def _run_with_retries(self, job: list[Batch]) -> list[Finished]:
        """Run the job until it succeeds, its attempts are spent or it is abandoned; the
        outcome of each of its batches that was not abandoned."""
        attempts = self.max_retries + 1
        attempt = 0
        outage = 0  # failed tries in a row because the sink was unreachable
        while attempt < attempts:
            attempt += 1
            began = time.monotonic()
            job = [b for b in job if not b.abandoned]
            if not job:
                return []
            label = _label(job)
            try:
                job = self._take_refused(job)
                if not job:
                    return []  # every record's schema refused: each settled on its own
                label = _label(job)
                abandoned = self._job(job)
            except BatchAbandoned as exc:
                log.info("%s", exc)
                return [(b, exc) for b in job]
            except SinkHalt as exc:
                return self._halt(job, label, exc)
            except Exception as exc:
                why = describe(exc)
                elapsed = time.monotonic() - began
                self.metrics.spark_job_seconds.observe(elapsed)
                self.metrics.errors.labels("spark").inc()
                if self._stopping.is_set():
                    err = SinkError(f"{label}: abandoned after a failed attempt: {why}")
                    return [(b, err) for b in job]
                if refused_credentials(exc):
                    # A wrong or missing token fails every batch alike, and retrying or
                    # dead-lettering cannot fix it: the pipeline stops, naming the setting.
                    halt = SinkHalt(
                        f"{label}: {token_refused(self.session_config, self._pipeline)}"
                    )
                    halt.__cause__ = exc
                    return self._halt(job, label, halt)
                down = unavailable(exc)
                if down is not None:
                    attempt -= 1  # an outage is no fault of the batch: the attempt is not spent
                    outage += 1
                    if self._wait_out_outage(label, outage, down):
                        err = SinkError(f"{label}: sink closed while unavailable: {why}")
                        return [(b, err) for b in job]
                    continue
                outage = 0
                if attempt == attempts:
                    return self._gave_up(job, label, attempt, why, exc)
                if self._wait_to_retry(label, attempt, attempts, why):
                    err = SinkError(f"{label}: sink closed while retrying: {why}")
                    return [(b, err) for b in job]
                continue
            return self._succeeded(job, label, time.monotonic() - began, abandoned)
        raise AssertionError("unreachable")

    def _halt(self, job: list[Batch], label: str, exc: SinkHalt) -> list[Finished]:
        """Not a failure a retry can fix: this job's batches and every later one stay unwritten."""
        if self._halted is None:
            log.error("%s: the sink halts: %s", label, exc)
        self._halted = exc
        self.metrics.spark_jobs.labels("failure").inc()
        return [(b, exc) for b in job]

    def _wait_out_outage(self, label: str, outage: int, down: str) -> bool:
        """The sink was unreachable ``outage`` tries in a row (``down`` says how): wait before
        the next try, which spends no attempt; True if the sink was closed meanwhile."""
        delay = min(UNAVAILABLE_BACKOFF_CAP, self.backoff * 2 ** (outage - 1))
        if self._session_gone():
            # The server answered: it is back, and forgot the session after a
            # restart. Nothing to wait out: a new session and the batch, at once.
            delay = 0.0
        self.metrics.spark_jobs.labels("retry").inc()
        log.warning(
            "%s: the sink is unavailable (try %d), retrying in %.1fs: %s",
            label,
            outage,
            delay,
            down,
        )
        return self._stopping.wait(delay)

    def _wait_to_retry(self, label: str, attempt: int, attempts: int, why: str) -> bool:
        """Attempt ``attempt`` of ``attempts`` failed (``why``): back off before the next; True
        if the sink was closed meanwhile."""
        self.metrics.spark_jobs.labels("retry").inc()
        delay = min(MAX_BACKOFF_SECONDS, self.backoff * 2 ** (attempt - 1))
        log.warning(
            "%s: Spark job failed (attempt %d of %d), retrying in %.1fs: %s",
            label,
            attempt,
            attempts,
            delay,
            why,
        )
        return self._stopping.wait(delay)

    def _gave_up(
        self, job: list[Batch], label: str, attempt: int, why: str, exc: Exception
    ) -> list[Finished]:
        """The job's last attempt failed with ``exc`` (``why``: described): each batch fails,
        its records carrying the attempts made, for the error policy."""
        self.metrics.spark_jobs.labels("failure").inc()
        log.error("%s: Spark job failed %d time(s), giving up: %s", label, attempt, why)
        failed: list[Finished] = []
        for batch in job:
            batch.items[:] = [item._replace(attempts=attempt) for item in batch.items]
            err = SinkError(f"batch {batch.id}: Spark job failed after {attempt} attempt(s): {why}")
            err.__cause__ = exc
            failed.append((batch, err))
        return failed

    def _succeeded(
        self, job: list[Batch], label: str, elapsed: float, abandoned: set[BatchId]
    ) -> list[Finished]:
        """The outcomes of a job that succeeded, counted: each batch written, or abandoned
        before its swap."""
        self.metrics.spark_jobs.labels("success").inc()
        self.metrics.spark_job_seconds.observe(elapsed)
        for batch in job:
            self.metrics.spark_batch_records.observe(batch.rows)
        self.metrics.spark_last_success.set(time.time())
        log.debug("%s: %d row(s) written in %.2fs", label, sum(b.rows for b in job), elapsed)
        return [
            (b, BatchAbandoned(f"batch {b.id}: partition revoked before the swap"))
            if b.id in abandoned
            else (b, None)
            for b in job
        ]

    def _take_refused(self, job: list[Batch]) -> list[Batch]:
        """The job without the records whose writer schema the registry refuses to this
        pipeline alone (TypedColumns.refused): each is settled failed on its own, with its
        SchemaDecodeError (the DLQ's headers name the id and the reason), and its batch is
        written without it; a batch left empty is dropped. RegistryUnavailable (the registry
        refuses every id, or does not answer) is raised: an outage the caller waits out."""
        if self.typed is None:
            return job
        taken: list[tuple[Batch, dict[int, BaseException]]] = []
        for batch in job:
            with_values = [i for i, it in enumerate(batch.items) if it.values]
            raws = [batch.items[i].record.raw_value for i in with_values]
            refused = self.typed.refused(raws)
            if refused:
                taken.append((batch, {with_values[i]: e for i, e in refused.items()}))
        if not taken:
            return job
        with self._cond:  # abandon() counts the running batches' items and the finished ones
            for batch, errors in taken:
                if not batch.abandoned:
                    self._finished.extend(
                        (Batch(batch.tp, batch.epoch, batch.opened_at, [batch.items[i]]), e)
                        for i, e in errors.items()
                    )
                batch.items[:] = [it for i, it in enumerate(batch.items) if i not in errors]
            self._cond.notify_all()
        return [b for b in job if b.items]

    def _job(self, job: list[Batch]) -> set[BatchId]:
        """Write the job's batches; the ids of those abandoned before their swap."""
        if self._halted is not None:
            raise self._halted
        session = self._ensure_session()
        assert self._writer is not None
        if self.typed is not None and not self._seeded:
            self.typed.seed(existing_value_types(session, self.spec.format, self.spec.path))
            self._seeded = True
        if len(job) == 1:
            self._job_of_one(session, job[0])
            return set()
        tables: list[pa.Table] = []
        ids: list[BatchId] = []  # what each batch writes (less than it holds: see _unwritten)
        of: dict[BatchId, Batch] = {}
        for batch in job:
            todo = self._unwritten(batch)
            table = None if todo is None else batch_table(todo, self.value_format, self.typed)
            if todo is None or table is None or not table.num_rows:
                continue  # already in the table, or every record dropped by processing
            index = pa.array([len(ids)] * table.num_rows, pa.int32())
            tables.append(table.append_column(BATCH_COLUMN, index))
            ids.append(todo.id)
            of[todo.id] = batch
        if not ids:
            return set()
        try:
            # Columns are inferred per batch: a column missing from one batch is null there,
            # and types that widen (int to double) are widened.
            table = pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            # The batches disagree on a column's type: each is written on its own.
            abandoned: set[BatchId] = set()
            for batch in job:
                try:
                    self._job_of_one(session, batch)
                except BatchAbandoned as exc:
                    log.info("%s", exc)
                    abandoned.add(batch.id)
            return abandoned
        df = session.createDataFrame(table)
        dropped = self._writer.write_batches(df, ids, lambda b: not of[b].abandoned)
        return {of[b].id for b in dropped}

    def _job_of_one(self, session: Any, batch: Batch) -> None:
        assert self._writer is not None
        todo = self._unwritten(batch)
        if todo is None:
            return
        table = batch_table(todo, self.value_format, self.typed)
        if table.num_rows == 0:
            return  # every record was dropped by processing: nothing to write
        df = session.createDataFrame(table)
        if self.transform is not None:
            df = self.transform(df)
        self._writer.write(df, todo.id, lambda: not batch.abandoned)

    def _unwritten(self, batch: Batch) -> Batch | None:
        """The part of ``batch`` its target does not hold yet (None: all of it is there).

        Only writers that record what they hold (Iceberg's snapshot summaries) answer; a batch
        read again after a crash between their commit and the offset commit is then dropped
        or cut, instead of replaced as the other writers do.
        """
        assert self._writer is not None
        through = self._writer.written_through(batch.tp)
        if through is None or through < batch.items[0].record.offset:
            return batch
        rest = [it for it in batch.items if it.record.offset > through]
        log.info(
            "batch %s: the table holds %s through offset %d; %d record(s) already written",
            batch.id,
            batch.tp,
            through,
            len(batch.items) - len(rest),
        )
        if not rest:
            return None
        return Batch(batch.tp, batch.epoch, batch.opened_at, rest)


def _label(job: list[Batch]) -> str:
    if len(job) == 1:
        return f"batch {job[0].id}"
    return f"batches {', '.join(str(b.id) for b in job)}"


def _typed_columns(spec: PipelineSpec, client: Any) -> TypedColumns | None:
    source = spec.source
    if source.format not in SCHEMA_FORMATS or source.schema_registry is None:
        return None
    if client is None:
        from offtake.schema_registry import make_client

        client = make_client(source.schema_registry)
    return TypedColumns(source.format, client, source.protobuf_message)


def make_spark_sink(
    spec: PipelineSpec,
    metrics: Metrics,
    session: Any | None = None,
    schema_registry: Any = None,
) -> SparkSink:
    """The engine's entry point for ``sink.spark``; ``session`` lets tests share one JVM;
    ``schema_registry``: the registry client of a schema'd source."""
    return SparkSink(spec, metrics, session=session, schema_registry=schema_registry)
