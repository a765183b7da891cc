"""Build a worker: the clients, source, processor, sink, dead-letter queue and processing stage
a spec asks for, handed to :class:`~offtake.engine.worker.Worker`.

The one place that decides which implementation of each part runs; callers (the CLI, the test
kit, tests) may pass their own clients, sink or processor instead.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from offtake.config import ConfigError
from offtake.config.spec import PipelineSpec
from offtake.engine.commits import Committer
from offtake.engine.dead_letters import DeadLetterQueue
from offtake.engine.delivery.at_least_once import AtLeastOnce
from offtake.engine.delivery.base import DeliveryMode
from offtake.engine.delivery.queue import Queue, until_settled
from offtake.engine.delivery.transactional import Transactional, TransactionCommitter
from offtake.engine.errors import ErrorPolicy
from offtake.engine.offsets import OffsetTracker
from offtake.engine.processing_stage import CHUNK, ProcessingStage
from offtake.engine.retry_topics import RetryRoute, RetrySender
from offtake.engine.settlements import Settlements
from offtake.engine.worker import Worker, WorkerParts
from offtake.formats.resolve import decoder_for, encoder_for
from offtake.health import Health
from offtake.kafka.config import (
    consumer_config,
    probe_consumer_config,
    producer_config,
    share_consumer_config,
    transactional_producer_config,
)
from offtake.kafka.protocols import ClientFactory, ConsumerLike
from offtake.kafka.share_source import ShareSource, group_settings
from offtake.kafka.source import KafkaSource
from offtake.kafka.transactional_producer import TransactionalProducer
from offtake.metrics import Metrics
from offtake.processing.base import Processor
from offtake.processing.calls import make_calls
from offtake.processing.function import (
    LIFESPAN,
    PassThrough,
    function_processor,
    load_function,
)
from offtake.sinks.base import Sink
from offtake.sinks.kafka_transactional import TransactionalKafkaSink
from offtake.sinks.log import LogSink


def build_worker(
    spec: PipelineSpec,
    *,
    clients: ClientFactory | None = None,
    sink: Sink | None = None,
    processor: Processor | None = None,
    metrics: Metrics | None = None,
    health: Health | None = None,
    instance_id: str | None = None,
    schema_registry: Any = None,
    pod_name: str | None = None,
) -> Worker:
    """The worker for ``spec``; any part passed in replaces the one the spec would make.

    ``pod_name``: the pod's name (the CLI passes the downward API's $POD_NAME), for the
    transactional.id of exactly-once (:func:`instance`).

    ``schema_registry``: the SchemaRegistryClient of the schema formats, instead of one for the
    spec's URL (the test kit passes confluent-kafka's in-memory client).
    """
    clients = clients or default_clients()
    metrics = metrics or Metrics(spec.name)
    health = health or Health(max_poll_interval_s=300.0)
    processor = processor or make_processor(spec)
    sink = sink or make_sink(spec, clients, metrics, instance_id, schema_registry, pod_name)
    settlements = Settlements()
    dlq: DeadLetterQueue | None = None
    retries: RetrySender | None = None
    route = RetryRoute.of(spec.errors, spec.source.topics)
    wants_dlq = spec.errors.policy == "dlq" and spec.errors.dlq is not None
    if wants_dlq or route is not None:
        # Exactly-once: dead letters and retry sends are part of the sink's transaction, so
        # they share its producer (a record is sent on once, with its offset, or not at all).
        # Otherwise one producer serves both.
        producer = (
            sink.producer
            if isinstance(sink, TransactionalKafkaSink)
            else clients.producer(producer_config(spec))
        )
        if wants_dlq and spec.errors.dlq is not None:
            dlq = DeadLetterQueue(producer, spec.errors.dlq.topic)
        if route is not None:
            retries = RetrySender(producer, route)
    policy = ErrorPolicy(spec.errors, settlements, dlq, metrics, retries)
    concurrency = spec.processor.concurrency
    calls = make_calls(processor, concurrency) if concurrency > 1 else None
    stage = ProcessingStage(
        processor,
        sink,
        policy,
        decoder_for(spec.source, schema_registry),
        settlements,
        metrics,
        spec.errors.max_retries,
        strict_ordering=spec.errors.ordering == "strict",
        health=health,
        calls=calls,
        concurrency=concurrency,
        order=spec.processor.order,
        # A batch function or a sidecar takes chunks (of distinct lanes); a function one record.
        chunk=CHUNK if spec.processor.batch or spec.processor.container is not None else 1,
    )

    source = make_source(spec, clients, instance_id, route)
    delivery = make_delivery(spec, source, stage, sink, metrics)
    # The stage numbers a record's attempts as the delivery mode says (queue mode: from the
    # broker's delivery count); set here, the policy being built with the stage.
    stage.intake.first_attempt = delivery.first_attempt
    stage.intake.all_first = delivery.all_first_attempts
    parts = WorkerParts(
        spec, source, stage, settlements, processor, sink, metrics, health, delivery, route
    )
    return Worker(parts)


def make_source(
    spec: PipelineSpec,
    clients: ClientFactory,
    instance_id: str | None,
    route: RetryRoute | None,
) -> KafkaSource | ShareSource:
    """The consumer: a share group's (``source.groupType: share``) or a consumer group's."""

    def probe_consumer() -> ConsumerLike:
        return clients.consumer(probe_consumer_config(spec))

    if spec.source.is_share_group:
        return ShareSource(
            clients,
            share_consumer_config(spec),
            list(spec.source.topics),
            group_settings(spec.source.start_from, spec.errors.max_retries),
            make_probe=probe_consumer,
        )
    return KafkaSource(
        clients,
        consumer_config(spec, instance_id),
        [*spec.source.topics, *spec.errors.retry_topic_names(spec.source.topics)],
        spec.source.start_from,
        probe_consumer,
        # A retry topic is read from its start when the group has no offset there yet: its
        # records were sent by this pipeline and must not be skipped (startFrom: latest).
        earliest_topics=route.topics if route is not None else frozenset(),
    )


def make_delivery(
    spec: PipelineSpec,
    source: KafkaSource | ShareSource,
    stage: ProcessingStage,
    sink: Sink,
    metrics: Metrics,
) -> DeliveryMode:
    """The delivery mode, chosen here and nowhere else (:mod:`offtake.engine.delivery.base`):

    - a share group's source: queue mode, each record acknowledged (:class:`Queue`), the
      source polling again once its last poll is settled;
    - a transactional Kafka sink: exactly-once, offsets in the sink's transaction
      (:class:`Transactional`);
    - otherwise at-least-once, consumer offset commits (:class:`AtLeastOnce`).
    """
    tracker = OffsetTracker()
    if isinstance(source, ShareSource):
        # A share consumer polls again once its last poll is settled: its wait between polls
        # ends on the processing thread's progress, not a fixed sleep later.
        waiting = stage.settlements.waiting
        source.idle_wait = until_settled(stage.progress, stage.wait_for_progress, waiting)
        return Queue(tracker, source, metrics)
    interval = spec.commit.interval_seconds
    max_in_flight = spec.limits.max_in_flight_messages
    if isinstance(sink, TransactionalKafkaSink):
        committer = TransactionCommitter(
            source, tracker, metrics, interval, max_in_flight, stage, sink
        )
        return Transactional(committer, source, spec.shutdown.drain_timeout_seconds)
    return AtLeastOnce(Committer(source, tracker, metrics, interval, max_in_flight))


def instance(instance_id: str | None, pod_name: str | None = None) -> str:
    """This worker's name among the pipeline's workers: for its transactional.id.

    The static-membership id or the pod's name survive a restart of the same pod, so a
    restarted worker fences its predecessor's open transaction at once; elsewhere (a local
    run) host and process id keep concurrent workers apart.
    """
    return instance_id or pod_name or f"{socket.gethostname()}-{os.getpid()}"


def default_clients() -> ClientFactory:
    from offtake.kafka.real import ConfluentClients

    return ConfluentClients()


SIDECAR_FORMATS = ("json", "string", "bytes")


def make_processor(spec: PipelineSpec) -> Processor:
    p = spec.processor
    if p.function is not None and p.in_processes:
        from offtake.processing.parallel import FunctionPoolProcessor

        return FunctionPoolProcessor(
            p.function, p.parallelism, p.batch, p.timeout_seconds, p.max_memory_mib
        )
    if p.function is not None:
        # def or async def, per record or per batch (processing/function.py).
        lifespan = load_function(p.lifespan, LIFESPAN) if p.lifespan is not None else None
        return function_processor(load_function(p.function), p.batch, lifespan=lifespan)
    if spec.processor.container is not None:
        from offtake.processing.sidecar import SidecarProcessor

        # Schema formats' values are decoded by the worker and carried as JSON.
        fmt = spec.source.format
        return SidecarProcessor(spec.processor.container, fmt if fmt in SIDECAR_FORMATS else "json")
    return PassThrough()


def make_sink(
    spec: PipelineSpec,
    clients: ClientFactory,
    metrics: Metrics,
    instance_id: str | None = None,
    schema_registry: Any = None,
    pod_name: str | None = None,
) -> Sink:
    sink = spec.sink
    if sink.kafka is not None and sink.kafka.exactly_once:
        config = transactional_producer_config(
            spec, sink.kafka.config, instance(instance_id, pod_name)
        )
        # Each transaction call, and a wait for room in the producer's queue, is bounded by
        # the transaction's own timeout: past it the coordinator aborts the transaction anyway.
        transaction_timeout = max(5.0, int(config["transaction.timeout.ms"]) / 1000)
        producer = TransactionalProducer(lambda: clients.producer(config), transaction_timeout)
        if not producer.transactional:
            raise ConfigError(
                "spec.sink.kafka.delivery",
                "exactly-once needs Kafka transactions, which these clients do not offer "
                "(the in-memory broker has none); use at-least-once here",
            )
        return TransactionalKafkaSink(
            producer,
            sink.kafka.topic,
            clients.topic_partition,
            commit_timeout=transaction_timeout,
            encode=encoder_for(sink.kafka, schema_registry).encode,
        )
    if sink.kafka is not None:
        from offtake.sinks.kafka import KafkaSink

        return KafkaSink(
            clients.producer(producer_config(spec, sink.kafka.config)),
            sink.kafka.topic,
            encoder_for(sink.kafka, schema_registry).encode,
        )
    if sink.spark is not None:
        from offtake.sinks.spark import make_spark_sink

        return make_spark_sink(spec, metrics, schema_registry=schema_registry)
    return LogSink()
