"""Decode throughput per source.format: avro, protobuf and jsonschema against json, same run.

    export PYTHONPATH=$PWD/worker:$PWD/testbed:$PWD/tests   # or pip install -e .
    python bench/decode.py                 # 50,000 records per format, 3 rounds (~2 minutes)
    python bench/decode.py --records 10000 --rounds 1

What is timed is the worker's decode step itself (``Decoder.records``, the batch path of the
decoder the worker builds for the format: offtake.formats.resolve) over real confluent_kafka
Message objects, read back from a real broker (the test bed's Kafka) where confluent-kafka's
serializers wrote them with schemas registered in a real registry (the test bed's Apicurio).
Writer schemas are fetched on the first record and cached, as in the worker. Best of the
rounds; formats run in a rotated order each round. The figures are records/s and the ratio
to json in the same run, so machines compare by ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from confluent_kafka import Producer
from support.schemas import order, serializer

from offtake.config.spec import SchemaRegistrySpec, SourceSpec
from offtake.formats.resolve import decoder_for
from offtake_testbed.apicurio import ApicurioRegistry
from offtake_testbed.kafka import KafkaBroker, read_topic

FORMATS = ("json", "avro", "protobuf", "jsonschema")


def encoder(fmt: str, url: str, topic: str) -> Any:
    if fmt == "json":
        return lambda v: json.dumps(v).encode()
    return serializer(fmt, url, topic)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with KafkaBroker() as broker, ApicurioRegistry() as registry:
        messages: dict[str, list[Any]] = {}
        for fmt in FORMATS:
            topic = f"bench-decode-{fmt}"
            broker.create_topic(topic, 1)
            encode = encoder(fmt, registry.url, topic)
            producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20})
            for i in range(args.records):
                producer.produce(topic, encode(order(i)))
                if i % 10_000 == 0:
                    producer.poll(0)
            assert producer.flush(60) == 0
            del producer  # before the broker stops, or it logs its reconnects
            messages[fmt] = read_topic(broker.bootstrap, topic)
            assert len(messages[fmt]) == args.records, (fmt, len(messages[fmt]))
        best: dict[str, float] = {}
        for r in range(args.rounds):
            order_ = FORMATS[r % len(FORMATS) :] + FORMATS[: r % len(FORMATS)]
            for fmt in order_:
                source = SourceSpec(
                    topics=("t",),
                    group_id="g",
                    group_type="consumer",
                    start_from="earliest",
                    format=fmt,  # type: ignore[arg-type]
                    schema_registry=SchemaRegistrySpec(registry.url) if fmt != "json" else None,
                    protobuf_message="support.orders_pb:Order" if fmt == "protobuf" else None,
                )
                decoder = decoder_for(source)  # a new one per round: the first lookup counts
                started = time.perf_counter()
                for i in range(0, len(messages[fmt]), 1000):  # as the worker: a poll at a time
                    decoded = decoder.records(messages[fmt][i : i + 1000], "t", 0)
                    assert all(error is None for _, error in decoded), decoded
                record = decoded[-1][0]
                rate = args.records / (time.perf_counter() - started)
                best[fmt] = max(best.get(fmt, 0.0), rate)
                assert record.value == order(args.records - 1), record.value
        anchor = best["json"]
        print(f"decode step, {args.records} records x {args.rounds} rounds, best round:")
        print(f"{'format':<12}{'records/s':>12}{'x json':>9}")
        for fmt in FORMATS:
            print(f"{fmt:<12}{best[fmt]:>12,.0f}{best[fmt] / anchor:>9.2f}")
        print(json.dumps({"records": args.records, "rounds": args.rounds, "rates": best}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
