"""The Python contenders of bench/concurrency.py other than Offtake, each run as its own process.

    python bench/concurrency_contenders.py ceiling --concurrency N --seconds S [--warmup W]
    python bench/concurrency_contenders.py arroyo --bootstrap B --input T --output O --group G \
        --concurrency N

- ``ceiling``: the bare asyncio client alone, no Kafka: N tasks, each calling the latency service
  in a loop (aiohttp, one session) with keys of its own (never overlapping), for ``--warmup``
  then ``--seconds`` seconds; prints one JSON line ``{"calls": C, "seconds": S}`` of the
  measured part. What this machine's Python gets from the service at N in flight.
- ``arroyo``: Sentry's Arroyo, ``RunTaskInThreads`` (N threads, the call on each, http.client)
  -> ``Produce`` -> ``CommitOffsets``, at least once, until SIGTERM.

The service's URL is in ``$OFFTAKE_BENCH_SERVICE`` (bench/concurrency_calls.py). Only the
standard library is imported at the top: Arroyo runs this file from its own virtualenv.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import concurrency_calls as calls


def ceiling(args: argparse.Namespace) -> None:
    print(json.dumps(asyncio.run(_ceiling(args.concurrency, args.seconds, args.warmup))))


async def _ceiling(concurrency: int, seconds: float, warmup: float) -> dict[str, float]:
    async with calls.http_session():
        counted = 0
        began = time.monotonic()
        measure_from = began + warmup
        stop_at = measure_from + seconds
        first: list[float] = []

        async def worker(i: int) -> None:
            nonlocal counted
            n = 0
            while True:
                now = time.monotonic()
                if now >= stop_at:
                    return
                await calls.call_async(b"c%d-%d" % (i, n))
                n += 1
                if now >= measure_from:  # a call that started in the measured window
                    counted += 1
                    if not first:
                        first.append(now)

        async def cpu_from() -> float:  # the process's CPU when the measured window opens
            await asyncio.sleep(max(0.0, measure_from - time.monotonic()))
            return time.process_time()

        cpu_at = asyncio.ensure_future(cpu_from())
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        ended = time.monotonic()
        cpu = time.process_time() - await cpu_at
    return {
        "calls": counted,
        "seconds": round(ended - measure_from, 3),
        # what one call costs the bare client: Offtake's event-loop thread against it
        "cpu_us_per_call": round(cpu / counted * 1e6, 1) if counted else 0.0,
    }


def arroyo(args: argparse.Namespace) -> None:
    """RunTaskInThreads(call, N threads) -> Produce -> CommitOffsets (Arroyo's own steps)."""
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
        RunTaskInThreads,
    )
    from arroyo.types import Commit, Message, Partition, Topic

    consumer = KafkaConsumer(
        build_kafka_consumer_configuration(
            {},
            group_id=args.group,
            auto_offset_reset="earliest",
            bootstrap_servers=[args.bootstrap],
        )
    )
    producer = KafkaProducer(build_kafka_configuration({}, bootstrap_servers=[args.bootstrap]))

    def call(message: Message[KafkaPayload]) -> KafkaPayload:
        payload = message.payload
        calls.call_sync(payload.key)
        return payload

    class Factory(ProcessingStrategyFactory[KafkaPayload]):  # type: ignore[misc]
        def create_with_partitions(
            self, commit: Commit, partitions: dict[Partition, int]
        ) -> ProcessingStrategy[KafkaPayload]:
            step: Any = Produce(producer, Topic(args.output), CommitOffsets(commit))
            # Futures waiting to be forwarded (in order) at most: twice the threads, so that
            # every thread has the next record to take while the oldest is forwarded.
            return RunTaskInThreads(call, args.concurrency, 2 * args.concurrency, step)  # type: ignore[no-any-return]

    processor = StreamProcessor(consumer, Topic(args.input), Factory(), ONCE_PER_SECOND)
    signal.signal(signal.SIGTERM, lambda *_: processor.signal_shutdown())
    signal.signal(signal.SIGINT, lambda *_: processor.signal_shutdown())
    try:
        processor.run()
    finally:
        producer.close().result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("contender", choices=("ceiling", "arroyo"))
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--bootstrap")
    parser.add_argument("--input")
    parser.add_argument("--output")
    parser.add_argument("--group")
    args = parser.parse_args()
    {"ceiling": ceiling, "arroyo": arroyo}[args.contender](args)


if __name__ == "__main__":
    main()
