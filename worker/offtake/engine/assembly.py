"""Build a worker: the clients, source, processor, sink, dead-letter queue and processing stage
a spec asks for, handed to :class:`~offtake.engine.worker.Worker`.

The one place that decides which implementation of each part runs; callers (the CLI, the test
kit, tests) may pass their own clients, sink or processor instead.
"""

from __future__ import annotations

from offtake.config.spec import PipelineSpec
from offtake.engine.completions import Completions
from offtake.engine.dead_letters import DeadLetterQueue
from offtake.engine.errors import ErrorPolicy
from offtake.engine.processing_stage import ProcessingStage
from offtake.engine.worker import Worker, WorkerParts
from offtake.health import Health
from offtake.kafka.config import consumer_config, probe_consumer_config, producer_config
from offtake.kafka.protocols import ClientFactory, ConsumerLike
from offtake.kafka.source import KafkaSource
from offtake.metrics import Metrics
from offtake.processing.base import Processor
from offtake.processing.function import FunctionProcessor, PassThrough, load_function
from offtake.sinks.base import Sink
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
) -> Worker:
    """The worker for ``spec``; any part passed in replaces the one the spec would make."""
    clients = clients or default_clients()
    metrics = metrics or Metrics(spec.name)
    health = health or Health(max_poll_interval_s=300.0)
    processor = processor or make_processor(spec)
    sink = sink or make_sink(spec, clients, metrics)
    completions = Completions()
    dlq: DeadLetterQueue | None = None
    if spec.errors.policy == "dlq" and spec.errors.dlq is not None:
        dlq = DeadLetterQueue(clients.producer(producer_config(spec)), spec.errors.dlq.topic)
    policy = ErrorPolicy(spec.errors, completions, dlq, metrics)
    stage = ProcessingStage(
        processor,
        sink,
        policy,
        spec.source.format,
        completions,
        metrics,
        spec.errors.max_retries,
    )

    def probe_consumer() -> ConsumerLike:
        return clients.consumer(probe_consumer_config(spec))

    source = KafkaSource(
        clients,
        consumer_config(spec, instance_id),
        list(spec.source.topics),
        spec.source.start_from,
        probe_consumer,
    )
    parts = WorkerParts(spec, source, stage, completions, processor, sink, metrics, health)
    return Worker(parts)


def default_clients() -> ClientFactory:
    from offtake.kafka.real import ConfluentClients

    return ConfluentClients()


def make_processor(spec: PipelineSpec) -> Processor:
    if spec.processor.function is not None:
        return FunctionProcessor(load_function(spec.processor.function))
    if spec.processor.container is not None:
        from offtake.processing.sidecar import SidecarProcessor

        return SidecarProcessor(spec.processor.container, spec.source.format)
    return PassThrough()


def make_sink(spec: PipelineSpec, clients: ClientFactory, metrics: Metrics) -> Sink:
    sink = spec.sink
    if sink.kafka is not None:
        from offtake.sinks.kafka import KafkaSink

        return KafkaSink(
            clients.producer(producer_config(spec, sink.kafka.config)), sink.kafka.topic
        )
    if sink.spark is not None:
        from offtake.sinks.spark import make_spark_sink

        return make_spark_sink(spec, metrics)
    return LogSink()
