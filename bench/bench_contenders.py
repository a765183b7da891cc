"""The Python contenders of bench/passthrough.py, each run as its own process.

    python bench/bench_contenders.py {loop,quix,arroyo} --bootstrap B --input T --output O \
        --group G --workload {bytes,json,cpu,avro,protobuf,jsonschema} [--parallelism N] \
        [--registry URL]

Each consumes ``--input`` from the earliest offset in group ``--group``, applies the workload's
function from bench_workloads.py and produces to ``--output`` at least once (the schema'd
workloads read and write the schema registry wire format with the registry at ``--registry``,
the output schema registered under the output topic's subject on first use) (an input offset is
committed only after its output was acknowledged), until SIGTERM; then it stops the way its
library stops gracefully (committing what it finished). The harness decides when a run is done
by watching the output topic, so nothing here counts or times anything.

Only the standard library is imported at the top: Quix Streams and Arroyo run this file from
their own virtualenvs (outside the repository), which have neither offtake nor each other.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_schemas as schemas
import bench_workloads as workloads

SCHEMA_KINDS = ("avro", "protobuf", "jsonschema")


def hand_written_loop(args: argparse.Namespace) -> None:
    """What an experienced user writes by hand, at least once (issue 24's anchor).

    ``consume(1000)``; the workload on each value (JSON with orjson, not the standard
    library's json); produce each; ``flush()`` (every output acknowledged); then an
    asynchronous commit of the batch's offsets, so the next batch is consumed while the commit
    travels. At SIGTERM the last offsets are committed synchronously before ``close()``.
    orjson is this environment's (Offtake's own dependency), like confluent-kafka.
    """
    import orjson
    from confluent_kafka import Consumer, Producer, TopicPartition

    def enrich_orjson(value: bytes) -> bytes:
        return orjson.dumps(workloads.enrich(orjson.loads(value)))

    transform: Callable[[bytes], bytes] | None
    if args.workload in SCHEMA_KINDS:
        transform = confluent_enrich(args)
    else:
        transform = {"bytes": None, "json": enrich_orjson, "cpu": workloads.burn}[args.workload]
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "linger.ms": 5,
            "enable.idempotence": True,
            "acks": "all",
        }
    )
    stopping = _stop_flag()
    consumer.subscribe([args.input])
    # Next offset to commit per (topic, partition): the batch's last offset + 1.
    positions: dict[tuple[str, int], int] = {}
    produce, output = producer.produce, args.output
    while not stopping:
        batch = consumer.consume(1000, 1.0)
        if not batch:
            continue
        batch_positions: dict[tuple[str, int], int] = {}
        for m in batch:
            if m.error() is not None:
                continue
            value = m.value() if transform is None else transform(m.value() or b"")
            try:
                produce(output, value, key=m.key(), headers=m.headers())
            except BufferError:  # the producer's queue is full: let it deliver, then retry
                producer.poll(0.1)
                produce(output, value, key=m.key(), headers=m.headers())
            batch_positions[(m.topic(), m.partition())] = m.offset() + 1
        producer.flush()  # every output of the batch acknowledged before its offsets commit
        if batch_positions:
            positions.update(batch_positions)
            consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in batch_positions.items()],
                asynchronous=True,
            )
    if positions:  # the graceful stop: the last batch's commit must land before close()
        producer.flush()
        try:
            consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in positions.items()],
                asynchronous=False,
            )
        except Exception as exc:  # e.g. revoked meanwhile: the next owner re-reads, at least once
            print(f"loop: final commit failed: {exc}", file=sys.stderr)
    consumer.close()


def hand_written_share_loop(args: argparse.Namespace) -> None:
    """The same loop on a share group (KIP-932): the queue-mode anchor (issue 39 item 2).

    confluent-kafka's ShareConsumer as its own tests use it at its best: implicit
    acknowledgement (every record of a poll is accepted by the next poll, no call per record),
    ``poll(1.0)`` returning up to ``max.poll.records`` records; the workload on each value,
    produce each, ``flush()`` (every output acknowledged) before the next poll accepts the
    batch. At SIGTERM the last batch is accepted with ``commit_sync`` before ``close()``. The
    group starts at the earliest offset (``share.auto.offset.reset``, a group config set with
    the AdminClient, as the worker does). ``--max-poll-records`` sets max.poll.records
    (10,000, as the worker's default).
    """
    import orjson
    from confluent_kafka import Producer, ShareConsumer  # type: ignore[attr-defined]
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    def enrich_orjson(value: bytes) -> bytes:
        return orjson.dumps(workloads.enrich(orjson.loads(value)))

    transform: Callable[[bytes], bytes] | None
    if args.workload in SCHEMA_KINDS:
        transform = confluent_enrich(args)
    else:
        transform = {"bytes": None, "json": enrich_orjson, "cpu": workloads.burn}[args.workload]
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    entry = ConfigEntry(
        "share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource(ResourceType.GROUP, args.group, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource], request_timeout=15).values():
        future.result()
    conf: dict[str, Any] = {"bootstrap.servers": args.bootstrap, "group.id": args.group}
    # 10,000 by default, not librdkafka's 500: one fetch then carries several partitions
    # (measured 1.4x to 1.75x the rate, docs/bench.md).
    conf["max.poll.records"] = args.max_poll_records
    consumer = ShareConsumer(conf)
    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "linger.ms": 5,
            "enable.idempotence": True,
            "acks": "all",
        }
    )
    stopping = _stop_flag()
    consumer.subscribe([args.input])
    produce, output = producer.produce, args.output
    while not stopping:
        batch = consumer.poll(1.0)  # accepts the previous poll's records (implicit mode)
        for m in batch:
            if m.error() is not None:
                continue
            value = m.value() if transform is None else transform(m.value() or b"")
            try:
                produce(output, value, key=m.key(), headers=m.headers())
            except BufferError:  # the producer's queue is full: let it deliver, then retry
                producer.poll(0.1)
                produce(output, value, key=m.key(), headers=m.headers())
        producer.flush()  # every output of the batch acknowledged before the next poll accepts it
    producer.flush()
    try:
        consumer.commit_sync()  # the graceful stop: the last batch accepted before close()
    except Exception as exc:
        print(f"loop-queue: final acknowledgement failed: {exc}", file=sys.stderr)
    consumer.close()


def confluent_enrich(args: argparse.Namespace) -> Callable[[bytes], bytes]:
    """The loop's schema'd enrich: confluent-kafka's own deserializer and serializer (what its
    documentation shows), the writer schema cached by its registry client."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": args.registry})
    ctx_in = SerializationContext(args.input, MessageField.VALUE)
    ctx_out = SerializationContext(args.output, MessageField.VALUE)
    enrich = workloads.enrich
    if args.workload == "avro":
        from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer

        avro_in, avro_out = (
            AvroDeserializer(client),
            AvroSerializer(client, schemas.SCHEMAS["avro"][1]),
        )
        return lambda raw: avro_out(enrich(avro_in(raw, ctx_in)), ctx_out)
    if args.workload == "jsonschema":
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer

        json_in = JSONDeserializer(None, schema_registry_client=client)
        json_out = JSONSerializer(schemas.SCHEMAS["jsonschema"][1], client)
        return lambda raw: json_out(enrich(json_in(raw, ctx_in)), ctx_out)
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
    from google.protobuf.json_format import MessageToDict, ParseDict

    conf = {"use.deprecated.format": False}
    pb_in = ProtobufDeserializer(schemas.BenchOrder, conf)
    out_class = schemas.BenchOrderOut
    pb_out = ProtobufSerializer(out_class, client, conf)

    def enrich_protobuf(raw: bytes) -> bytes:
        value = MessageToDict(  # with its fields at their default (0, ""): enrich reads them
            pb_in(raw, ctx_in),
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True,
        )
        return pb_out(ParseDict(enrich(value), out_class()), ctx_out)

    return enrich_protobuf


def quix_serde(args: argparse.Namespace) -> tuple[Any, Any]:
    """Quix Streams' value deserializer and serializer for the workload."""
    import json

    if args.workload not in SCHEMA_KINDS:
        serial = "json" if args.workload == "json" else "bytes"
        return serial, serial
    from quixstreams.models import SchemaRegistryClientConfig

    registry = SchemaRegistryClientConfig(url=args.registry)
    if args.workload == "avro":
        from quixstreams.models.serializers.avro import AvroDeserializer, AvroSerializer

        return (
            AvroDeserializer(schema_registry_client_config=registry),
            AvroSerializer(schemas.BENCH_ORDER_OUT.avro(), schema_registry_client_config=registry),
        )
    if args.workload == "jsonschema":
        from quixstreams.models.serializers.json import JSONDeserializer, JSONSerializer

        return (
            JSONDeserializer(
                schema=json.loads(schemas.SCHEMAS["jsonschema"][0]),
                schema_registry_client_config=registry,
            ),
            JSONSerializer(
                schema=json.loads(schemas.SCHEMAS["jsonschema"][1]),
                schema_registry_client_config=registry,
            ),
        )
    from quixstreams.models.serializers.protobuf import ProtobufDeserializer, ProtobufSerializer

    return (
        ProtobufDeserializer(
            schemas.BenchOrder,
            preserving_proto_field_name=True,
            schema_registry_client_config=registry,
        ),
        ProtobufSerializer(schemas.BenchOrderOut, schema_registry_client_config=registry),
    )


def quix(args: argparse.Namespace) -> None:
    """Quix Streams: ``app.dataframe(topic).to_topic(out)``, at-least-once (its default)."""
    from quixstreams import Application

    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee="at-least-once",
        loglevel="WARNING",
    )
    deserializer, serializer = quix_serde(args)
    source = app.topic(args.input, key_deserializer="bytes", value_deserializer=deserializer)
    sink = app.topic(args.output, key_serializer="bytes", value_serializer=serializer)
    sdf = app.dataframe(source)
    if args.workload == "json" or args.workload in SCHEMA_KINDS:
        sdf = sdf.apply(workloads.enrich)
    elif args.workload == "cpu":
        sdf = sdf.apply(workloads.burn)
    sdf.to_topic(sink)
    app.run()  # stops gracefully (and commits) on SIGTERM


def arroyo(args: argparse.Namespace) -> None:
    """Sentry's Arroyo: [RunTask or RunTaskWithMultiprocessing ->] Produce -> CommitOffsets."""
    from arroyo.backends.kafka import KafkaConsumer, KafkaPayload, KafkaProducer
    from arroyo.backends.kafka.configuration import (
        build_kafka_configuration,
        build_kafka_consumer_configuration,
    )
    from arroyo.commit import ONCE_PER_SECOND
    from arroyo.processing import StreamProcessor
    from arroyo.processing.strategies import (
        CommitOffsets,
        ProcessingStrategy,
        ProcessingStrategyFactory,
        Produce,
        RunTask,
        RunTaskWithMultiprocessing,
    )
    from arroyo.processing.strategies.run_task_with_multiprocessing import MultiprocessingPool
    from arroyo.types import Commit, Partition, Topic

    consumer = KafkaConsumer(
        build_kafka_consumer_configuration(
            {},
            group_id=args.group,
            auto_offset_reset="earliest",
            bootstrap_servers=[args.bootstrap],
        )
    )
    producer = KafkaProducer(build_kafka_configuration({}, bootstrap_servers=[args.bootstrap]))
    pool = MultiprocessingPool(args.parallelism) if args.parallelism > 1 else None
    function = {"json": transform_json, "cpu": transform_cpu}.get(args.workload)

    class Factory(ProcessingStrategyFactory[KafkaPayload]):  # type: ignore[misc]
        def create_with_partitions(
            self, commit: Commit, partitions: dict[Partition, int]
        ) -> ProcessingStrategy[KafkaPayload]:
            step: Any = Produce(producer, Topic(args.output), CommitOffsets(commit))
            if function is not None and pool is not None:
                step = RunTaskWithMultiprocessing(
                    function,
                    step,
                    # Arroyo's usual batch bounds (Sentry's consumers use 1000 records / 1 s).
                    max_batch_size=1000,
                    max_batch_time=1.0,
                    pool=pool,
                    input_block_size=16 << 20,
                    output_block_size=16 << 20,
                )
            elif function is not None:
                step = RunTask(function, step)
            return step  # type: ignore[no-any-return,unused-ignore]

    processor = StreamProcessor(consumer, Topic(args.input), Factory(), ONCE_PER_SECOND)
    signal.signal(signal.SIGTERM, lambda *_: processor.signal_shutdown())
    signal.signal(signal.SIGINT, lambda *_: processor.signal_shutdown())
    try:
        processor.run()
    finally:
        producer.close().result()
        if pool is not None:
            pool.close()


# Arroyo's transforms: top-level, so that RunTaskWithMultiprocessing can pickle them.
def transform_json(message: Any) -> Any:
    payload = message.payload
    return type(payload)(payload.key, workloads.enrich_bytes(payload.value), payload.headers)


def transform_cpu(message: Any) -> Any:
    payload = message.payload
    return type(payload)(payload.key, workloads.burn(payload.value), payload.headers)


class _StopFlag:
    """False until SIGTERM or SIGINT arrives."""

    def __init__(self) -> None:
        self.set = False

    def __bool__(self) -> bool:
        return self.set


def _stop_flag() -> _StopFlag:
    flag = _StopFlag()

    def handler(*_: object) -> None:
        flag.set = True

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return flag


CONTENDERS: dict[str, Callable[[argparse.Namespace], None]] = {
    "loop": hand_written_loop,
    "loop-queue": hand_written_share_loop,
    "quix": quix,
    "arroyo": arroyo,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("contender", choices=sorted(CONTENDERS))
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    kinds = ("bytes", "json", "cpu", *SCHEMA_KINDS)
    parser.add_argument("--workload", choices=kinds, default="bytes")
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--registry", help="the schema registry's URL (schema'd workloads)")
    parser.add_argument(
        "--max-poll-records",
        type=int,
        default=10_000,
        help="loop-queue: the share consumer's max.poll.records (10,000: its best measured)",
    )
    args = parser.parse_args()
    CONTENDERS[args.contender](args)


if __name__ == "__main__":
    main()
