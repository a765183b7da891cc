"""Build the parts a spec asks for: clients, processor and sink."""

from __future__ import annotations

from offtake.config.spec import PipelineSpec
from offtake.engine.kafka_config import producer_config
from offtake.kafka.protocols import ClientFactory
from offtake.metrics import Metrics
from offtake.processing.base import Processor
from offtake.processing.function import FunctionProcessor, PassThrough, load_function
from offtake.sinks.base import Sink
from offtake.sinks.log import LogSink


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
