"""The test kit's implementation; users import its names from :mod:`offtake.testing`.

Workers are the real engine (:class:`offtake.engine.worker.Worker`) in threads, with clients
from :class:`~offtake.kafka.memory.MemoryBroker`, so the delivery semantics under test are the
product's own. ``spec.kafka.bootstrapServers`` is ignored; ``spec.kafka.config`` still applies
(``partition.assignment.strategy``, ``max.poll.interval.ms``, ...).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import yaml

from offtake.config.loader import load_pipeline, parse_pipeline
from offtake.config.spec import PipelineSpec, is_topic_pattern, matching_topics
from offtake.errors import OfftakeError
from offtake.formats.plain import encode_value
from offtake.formats.resolve import PLAIN_DECODERS, schema_decoder
from offtake.kafka.memory import (
    ClientKilled,
    GroupEvent,
    MemoryBroker,
    MemoryClients,
    MemoryMessage,
)
from offtake.processing.base import Processor
from offtake.processing.function import AWAITABLES, function_processor, load_function, values_of
from offtake.records import Record

log = logging.getLogger("offtake.testing")  # the name users know it by

Manifest: TypeAlias = str | Path | Mapping[str, Any] | PipelineSpec
ProcessorArg: TypeAlias = Processor | Callable[[Record], Any] | None

# How long a graceful stop may take beyond the pipeline's own drain budget before the harness
# reports the worker as hung.
_STOP_GRACE = 10.0


# -- schema'd records without a registry ---------------------------------------------------

SCHEMA_FORMATS = ("avro", "protobuf", "jsonschema")


def in_memory_registry() -> Any:
    """confluent-kafka's own in-memory schema registry client (its ``mock://`` URL): what the
    test kit's workers and :func:`encode` use instead of a registry server."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient.new_client({"url": "mock://offtake-testing"})


def encode(fmt: str, value: Any, schema: Any, *, registry: Any, topic: str = "t") -> bytes:
    """``value`` in the schema registry wire format, as a producer with confluent-kafka's
    serializer would write it (the schema registered in ``registry`` for ``<topic>-value``).

    ``schema``: avro and jsonschema, the schema (a dict or its JSON text); protobuf, the
    generated message class (``value`` a dict of its fields, or a message).
    """
    from confluent_kafka.serialization import MessageField, SerializationContext

    ctx = SerializationContext(topic, MessageField.VALUE)
    text = schema if isinstance(schema, str) or fmt == "protobuf" else json.dumps(schema)
    if fmt == "avro":
        from confluent_kafka.schema_registry.avro import AvroSerializer

        return bytes(AvroSerializer(registry, text)(value, ctx))
    if fmt == "jsonschema":
        from confluent_kafka.schema_registry.json_schema import JSONSerializer

        return bytes(JSONSerializer(text, registry)(value, ctx))
    if fmt == "protobuf":
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
        from google.protobuf.json_format import ParseDict

        message = ParseDict(value, schema()) if isinstance(value, Mapping) else value
        serializer = ProtobufSerializer(schema, registry, {"use.deprecated.format": False})
        return bytes(serializer(message, ctx))
    raise ValueError(f"not a schema format: {fmt!r} (expected one of {', '.join(SCHEMA_FORMATS)})")


def _uses_schemas(spec: PipelineSpec) -> bool:
    kafka = spec.sink.kafka
    return spec.source.format in SCHEMA_FORMATS or (kafka is not None and kafka.format != "json")


# -- results --------------------------------------------------------------------------------


def decode_output(raw: bytes | None) -> Any:
    """An output value as the test sees it: JSON if it parses, else text, else bytes."""
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw
    try:
        return json.loads(text)
    except ValueError:
        return text


def headers_of(message: MemoryMessage) -> dict[str, str | None]:
    """A record's headers as a dict of text (the last value wins for repeated names)."""
    out: dict[str, str | None] = {}
    for name, value in message.headers() or []:
        out[name] = None if value is None else value.decode("utf-8", "replace")
    return out


@dataclass
class PipelineRun:
    """What a pipeline run left behind, read from the broker after the workers stopped."""

    spec: PipelineSpec
    outputs: list[Any]  # sink topic values, decoded (see decode_output); [] for non-Kafka sinks
    output_messages: list[MemoryMessage]  # the same records, raw, in partition/offset order
    dlq: list[MemoryMessage]  # dead-letter records (see headers_of for their headers)
    committed: dict[tuple[str, int], int | None]  # source partition -> committed offset
    lag: dict[tuple[str, int], int]  # source partition -> log end minus committed
    exit_codes: list[int | None]  # per worker; None when killed or still running
    errors: list[BaseException | None]  # per worker: an exception that escaped Worker.run()
    rejected_commits: list[str]  # commits the broker refused (an engine bug if not empty)
    events: list[GroupEvent] = field(default_factory=list)  # the group's rebalance history
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """Everything committed, every worker exited 0 (killed ones aside), nothing rejected."""
        return (
            not self.timed_out
            and not any(self.lag.values())
            and all(code in (0, None) for code in self.exit_codes)
            and not any(self.errors)
            and not self.rejected_commits
        )


class PipelineTimeout(OfftakeError, AssertionError):
    """A wait ran out of time; ``run`` holds the state at that moment."""

    def __init__(self, message: str, run: PipelineRun) -> None:
        super().__init__(message)
        self.run = run


# -- the harness ------------------------------------------------------------------------------


@dataclass
class WorkerHandle:
    """One worker thread of a harness."""

    index: int
    worker: Any  # offtake.engine.worker.Worker
    clients: MemoryClients
    thread: threading.Thread
    exit_code: int | None = None
    error: BaseException | None = None
    killed: bool = False

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and not self.killed

    @property
    def ready(self) -> bool:
        return self.alive and bool(self.worker.ready)


def _load(manifest: Manifest) -> PipelineSpec:
    if isinstance(manifest, PipelineSpec):
        return manifest
    if isinstance(manifest, Mapping):
        return parse_pipeline(manifest)
    if isinstance(manifest, str) and "\n" in manifest:
        # Manifest text rather than a path: the same document selection as the loader.
        docs = [d for d in yaml.safe_load_all(manifest) if isinstance(d, Mapping)]
        pipelines = [d for d in docs if d.get("kind") == "ConsumerPipeline"] or docs
        if len(pipelines) != 1:
            raise ValueError(f"expected one ConsumerPipeline document, found {len(pipelines)}")
        return parse_pipeline(pipelines[0])
    return load_pipeline(manifest)


def _install_kill_hook() -> None:
    """Keep ClientKilled in a killed worker's other threads out of the test output."""
    previous = threading.excepthook
    if getattr(previous, "_offtake_kill_hook", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is not None and issubclass(args.exc_type, ClientKilled):
            return
        previous(args)

    hook._offtake_kill_hook = True  # type: ignore[attr-defined]
    threading.excepthook = hook


class PipelineHarness:
    """Workers of one pipeline in threads against a memory broker; a context manager.

    ``processor`` replaces the manifest's processor: a :class:`Processor` (shared by all
    workers, so it must be thread-safe) or a plain function of a :class:`Record` (wrapped per
    worker like ``processor.function``). Topics the spec names and the broker lacks are
    created, source and retry topics with ``partitions`` partitions.
    """

    def __init__(
        self,
        manifest: Manifest,
        broker: MemoryBroker,
        *,
        processor: ProcessorArg = None,
        partitions: int = 1,
        schema_registry: Any = None,
    ) -> None:
        self.spec = _load(manifest)
        self.broker = broker
        self.processor = processor
        # avro | protobuf | jsonschema: the workers use this client, never the spec's URL; an
        # in-memory one unless the test brings its own (to share it with its producers).
        self.schema_registry = schema_registry
        if schema_registry is None and _uses_schemas(self.spec):
            self.schema_registry = in_memory_registry()
        self.workers: list[WorkerHandle] = []
        existing = broker.topics()
        for topic in self._input_topics():
            if topic not in existing and not is_topic_pattern(topic):
                broker.create_topic(topic, partitions)
        for topic in self._output_topics():
            if topic not in existing:
                broker.create_topic(topic, 1)

    def _input_topics(self) -> list[str]:
        """Source topics and their retry topics (errors.retryTopics), which the group reads;
        a pattern stands for the broker's topics it matches now."""
        source = tuple(matching_topics(self.spec.source.topics, self.broker.topics()))
        return [*source, *self.spec.errors.retry_topic_names(source)]

    def _output_topics(self) -> list[str]:
        out = []
        if self.spec.sink.kafka is not None:
            out.append(self.spec.sink.kafka.topic)
        if self.spec.errors.dlq is not None:
            out.append(self.spec.errors.dlq.topic)
        return out

    # -- workers -------------------------------------------------------------------------
    def _make_processor(self) -> Processor | None:
        p = self.processor
        if p is None or isinstance(p, Processor):
            return p
        return function_processor(p, self.spec.processor.batch)

    def add_worker(self, *, instance_id: str | None = None) -> int:
        """Start one more worker; returns its index."""
        from offtake.engine.assembly import build_worker

        index = len(self.workers)
        clients = self.broker.clients(f"{self.spec.name}-w{index}")
        worker = build_worker(
            self.spec,
            clients=clients,
            processor=self._make_processor(),
            instance_id=instance_id,
            schema_registry=self.schema_registry,
        )
        handle = WorkerHandle(index, worker, clients, threading.Thread())
        handle.thread = threading.Thread(
            target=self._run, args=(handle,), name=f"offtake-test-worker-{index}", daemon=True
        )
        self.workers.append(handle)
        handle.thread.start()
        return index

    @staticmethod
    def _run(handle: WorkerHandle) -> None:
        try:
            handle.exit_code = handle.worker.run()
        except ClientKilled:
            pass  # the harness killed it: no exit code, like a SIGKILLed process
        except BaseException as exc:
            handle.error = exc
            log.exception("worker %d raised out of Worker.run()", handle.index)

    def stop_worker(self, index: int, timeout: float | None = None) -> int | None:
        """Stop a worker gracefully (what SIGTERM does) and wait; returns its exit code."""
        handle = self.workers[index]
        if handle.killed:
            return None
        handle.worker.stop("stopped by the test harness")
        wait = (
            timeout
            if timeout is not None
            else self.spec.shutdown.drain_timeout_seconds + _STOP_GRACE
        )
        handle.thread.join(wait)
        if handle.thread.is_alive():
            raise TimeoutError(f"worker {index} did not stop within {wait:.1f}s of a graceful stop")
        return handle.exit_code

    def kill_worker(self, index: int) -> None:
        """Abandon a worker as SIGKILL would: nothing more reaches the broker from it.

        Its consumer leaves the group at once without a revoke (the others get its
        partitions from the last committed offsets), messages its producers had not written
        are dropped, and its thread ends at its next client call.
        """
        _install_kill_hook()
        handle = self.workers[index]
        handle.killed = True
        handle.clients.kill()
        handle.thread.join(1.0)

    def stop_all(self) -> list[int | None]:
        """Stop every live worker gracefully, all at once, and wait for them."""
        live = [h for h in self.workers if h.alive]
        for h in live:
            h.worker.stop("stopped by the test harness")
        wait = self.spec.shutdown.drain_timeout_seconds + _STOP_GRACE
        deadline = time.monotonic() + wait
        for h in live:
            h.thread.join(max(0.0, deadline - time.monotonic()))
        hung = [h.index for h in live if h.thread.is_alive()]
        if hung:
            raise TimeoutError(f"workers {hung} did not stop within {wait:.1f}s of a graceful stop")
        return [h.exit_code for h in self.workers]

    # -- waiting -------------------------------------------------------------------------
    def lag(self) -> dict[tuple[str, int], int]:
        lag: dict[tuple[str, int], int] = self.broker.lag(
            self.spec.source.group_id, self._input_topics()
        )
        return lag

    def all_committed(self) -> bool:
        """True when the group committed every record of every source partition."""
        return not any(self.lag().values())

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        """Wait for ``predicate()``; raise :class:`PipelineTimeout` (with the state) on timeout.

        Also returns early when no worker is running any more (nothing can change).
        """
        deadline = time.monotonic() + timeout
        while True:
            if predicate():
                return
            if self.workers and not any(h.alive for h in self.workers):
                return
            if time.monotonic() >= deadline:
                run = self.result(timed_out=True)
                raise PipelineTimeout(
                    f"pipeline {self.spec.name}: condition not met within {timeout:.1f}s; "
                    f"lag {_describe_lag(run.lag)}; exit codes {run.exit_codes}; "
                    f"rejected commits {run.rejected_commits or 'none'}",
                    run,
                )
            time.sleep(0.02)

    def wait_until_committed(self, timeout: float = 30.0) -> None:
        """Wait until the group committed every record currently in the source topics."""
        self.wait_until(self.all_committed, timeout)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until every live worker reports ready (it received its first assignment)."""
        self.wait_until(lambda: all(h.ready for h in self.workers if h.alive), timeout)

    # -- data ----------------------------------------------------------------------------
    def produce(
        self,
        value: Any,
        key: Any = None,
        *,
        topic: str | None = None,
        partition: int | None = None,
        headers: Any = None,
    ) -> MemoryMessage:
        """Produce one input record (to the first source topic unless ``topic`` is given)."""
        topic = topic or self.spec.source.topics[0]
        if is_topic_pattern(topic):
            raise ValueError(f"source.topics[0] is the pattern {topic!r}: pass topic= to produce")
        return self.broker.produce(
            topic,
            value,
            key=key,
            partition=partition,
            headers=headers,
        )

    def outputs(self) -> list[Any]:
        return [decode_output(m.value()) for m in self.output_messages()]

    def output_messages(self) -> list[MemoryMessage]:
        kafka = self.spec.sink.kafka
        return self.broker.records(kafka.topic) if kafka is not None else []

    def dlq(self) -> list[MemoryMessage]:
        d = self.spec.errors.dlq
        return self.broker.records(d.topic) if d is not None else []

    def result(self, *, timed_out: bool = False) -> PipelineRun:
        """The run as it stands now (call after stopping the workers for final numbers)."""
        group = self.spec.source.group_id
        committed = {
            (t, p): self.broker.committed(group, t, p)
            for t in matching_topics(self.spec.source.topics, self.broker.topics())
            for p in self.broker.end_offsets(t)
        }
        messages = self.output_messages()
        return PipelineRun(
            spec=self.spec,
            outputs=[decode_output(m.value()) for m in messages],
            output_messages=messages,
            dlq=self.dlq(),
            committed=committed,
            lag=self.lag(),
            exit_codes=[h.exit_code for h in self.workers],
            errors=[h.error for h in self.workers],
            rejected_commits=self.broker.rejected_commits,
            events=self.broker.events(group),
            timed_out=timed_out,
        )

    def __enter__(self) -> PipelineHarness:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        try:
            self.stop_all()
        except TimeoutError:
            if exc_type is None:
                raise
            # A test already failed inside the block: report that, not the hung stop.
            log.exception("workers did not stop after a failure in the harness block")


def _describe_lag(lag: Mapping[tuple[str, int], int]) -> str:
    behind = {f"{t}[{p}]": n for (t, p), n in sorted(lag.items()) if n}
    return ", ".join(f"{k}={v}" for k, v in behind.items()) or "none"


def run_pipeline(
    manifest: Manifest,
    broker: MemoryBroker,
    *,
    workers: int = 1,
    until: Callable[[], bool] | None = None,
    timeout: float = 30.0,
    processor: ProcessorArg = None,
    partitions: int = 1,
    schema_registry: Any = None,
) -> PipelineRun:
    """Run ``workers`` workers until each has joined the group (received its first
    assignment) and every input record is committed (or ``until()`` holds), stop them
    gracefully and return what happened. Waiting for every worker to join makes a run of N
    workers a group of N even when the first ones commit everything before the last joins.

    The wait also ends when every worker exited on its own (``errors.policy: stop``): the
    run then shows their exit codes and the lag. If the wait times out, the workers are
    stopped and :class:`PipelineTimeout` is raised with the run attached as ``.run``.
    With ``source.startFrom: latest`` records produced before the workers joined are never
    consumed, so pass ``until`` instead of waiting for them.
    """
    with PipelineHarness(
        manifest,
        broker,
        processor=processor,
        partitions=partitions,
        schema_registry=schema_registry,
    ) as h:
        for _ in range(workers):
            h.add_worker()
        deadline = time.monotonic() + timeout
        try:
            h.wait_ready(timeout)
            h.wait_until(until or h.all_committed, max(0.0, deadline - time.monotonic()))
        except PipelineTimeout as exc:
            h.stop_all()
            exc.run = h.result(timed_out=True)
            raise
        h.stop_all()
        return h.result()


# -- one record -------------------------------------------------------------------------------


def process(
    fn: str | Callable[[Record], Any],
    record_value: Any,
    *,
    key: bytes | str | None = None,
    topic: str = "t",
    partition: int = 0,
    offset: int = 0,
    headers: Iterable[tuple[str, bytes | None]] = (),
    timestamp: int | None = None,
    format: str | None = None,
    schema: Any = None,
    registry: Any = None,
) -> list[Any]:
    """Call a processing function on one record the way the worker does; return its values.

    ``fn`` is a callable or a ``module:callable`` path (as in ``processor.function``). The
    result is what the worker would send on: ``[]`` when the function returns None, the list
    when it returns a list, else ``[value]``. Exceptions propagate, so a test sees them.

    By default ``record_value`` is the decoded value the function receives. With ``format``
    (json, string or bytes) it is the raw value instead (bytes or str) and is decoded like
    ``source.format`` first; invalid input raises like the worker's decode step.

    With ``format`` avro, protobuf or jsonschema, no registry is needed: ``record_value`` is
    encoded with ``schema`` (see :func:`encode`) in confluent-kafka's in-memory registry and
    decoded the way the worker decodes it, so the function sees exactly the worker's value (a
    value that does not fit the schema raises). Bytes already in the wire format are decoded
    with ``registry`` (a client holding their schema) instead (protobuf: still pass the
    message class as ``schema``).
    """
    function = load_function(fn) if isinstance(fn, str) else fn
    raw: bytes | None
    if format in SCHEMA_FORMATS:
        if isinstance(record_value, bytes):
            if registry is None:
                raise ValueError("wire-format bytes need registry=, the client with their schema")
            raw = record_value
        else:
            if schema is None:
                raise ValueError(f"format {format!r} needs schema= to encode the value with")
            registry = registry or in_memory_registry()
            raw = encode(format, record_value, schema, registry=registry, topic=topic)
        message_class = schema if format == "protobuf" else None
        value = schema_decoder(format, registry, message_class).value(raw, topic)
    elif format is not None:
        raw = record_value.encode("utf-8") if isinstance(record_value, str) else record_value
        value = None if raw is None else PLAIN_DECODERS[format]().value(raw, topic)
    else:
        raw, value = encode_value(record_value), record_value
    record = Record(
        topic=topic,
        partition=partition,
        offset=offset,
        key=key.encode("utf-8") if isinstance(key, str) else key,
        value=value,
        headers=tuple(headers),
        timestamp=int(time.time() * 1000) if timestamp is None else timestamp,
        raw_value=raw,
    )
    result = function(record)
    if isinstance(result, AWAITABLES):  # an async def, awaited as the worker awaits it
        result = asyncio.run(_awaited(result))
    values: list[Any] = values_of(result)
    return values


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
