"""The processing thread's CPU per record, without Kafka: before/after on a shared machine.

``bench/passthrough.py`` measures a whole worker against a broker; on a shared 2-core machine
its CPU per record moves by 10-40% between rounds (librdkafka's threads, wake-ups, the
neighbours), more than most single changes to the engine's per-record work. This measures
that work alone: :meth:`ProcessingStage._handle` (decode, the function, routing, the Kafka
sink's produce loop) on Works of 500 real ``confluent_kafka.Message`` objects, one partition,
into a :class:`KafkaSink` whose real producer has no broker (``produce()`` queues locally and
no delivery report comes while timed: what a round queued is purged, and the purge's reports
served, between rounds), in the calling thread, by ``time.process_time``. Best of
``--reps``; with ``--baseline DIR`` the other checkout's worker runs in turns with this
one's, each in its own process.

    python bench/stage_cpu.py --workload json --baseline /work/main

It leaves out what the whole run has and this has not: the poll loop, delivery reports,
commits, librdkafka's threads. Use it to compare engines, not against the loop.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
WORKER = BENCH.parent / "worker"
BATCH = 500


def measure(kind: str, records: int, reps: int) -> float:
    """Best CPU microseconds per record of ``reps`` runs over ``records`` records."""
    import gc

    from confluent_kafka import Message, Producer

    from offtake.config.loader import parse_pipeline
    from offtake.engine.assembly import build_worker
    from offtake.engine.work import Work
    from offtake.formats.plain import encode_value
    from offtake.kafka.memory import MemoryBroker
    from offtake.records import TopicPartition
    from offtake.sinks.kafka import KafkaSink

    spec: dict[str, Any] = {
        "kafka": {"bootstrapServers": "unused:9092"},
        "source": {"topics": ["in"], "groupId": "g", "format": kind},
        "sink": {"kafka": {"topic": "out"}},
    }
    if kind == "json":
        spec["processor"] = {"function": "bench_workloads:offtake_enrich"}
    doc = {"apiVersion": "offtake.dev/v1alpha1", "kind": "ConsumerPipeline"}
    doc["metadata"], doc["spec"] = {"name": "stage", "namespace": "bench"}, spec
    conf = {"bootstrap.servers": "127.0.0.1:1", "log_level": 0}
    conf.update({"queue.buffering.max.messages": 10_000_000, "queue.buffering.max.kbytes": 2**21})
    producer = Producer(conf)
    sink = KafkaSink(producer, "out", encode_value)
    stage = build_worker(parse_pipeline(doc), clients=MemoryBroker().clients(), sink=sink).stage
    stage.router.start()
    tp = TopicPartition("in", 0)
    stage.set_current({tp: 1})
    values = [
        json.dumps({"id": i, "customer": f"c{i % 100}", "amount": i % 2000 + 0.5}).encode()
        for i in range(BATCH)
    ]
    best = float("inf")
    for _ in range(reps):
        works = []
        for b in range(records // BATCH):
            offsets = [b * BATCH + i for i in range(BATCH)]
            messages: list[Any] = [
                Message(
                    topic="in", partition=0, offset=o, key=b"k%07d" % o, value=v, timestamp=(1, 1)
                )
                for o, v in zip(offsets, values, strict=True)
            ]
            works.append(Work(tp, 1, messages, offsets))
        gc.collect()
        started = time.process_time()
        for work in works:
            stage._handle(work)
        best = min(best, (time.process_time() - started) / (len(works) * BATCH) * 1e6)
        # Drop what was queued; its purge reports are served here, untimed, so that no round
        # times the failure path of the one before.
        producer.purge()
        producer.flush(10.0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=("json", "bytes"), default="json")
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--reps", type=int, default=7, help="runs per turn, best kept")
    parser.add_argument("--turns", type=int, default=3, help="turns of each checkout")
    parser.add_argument("--baseline", type=Path, help="another checkout, run in turns")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(measure(args.workload, args.records, args.reps))
        return
    sides = {"offtake": WORKER}
    if args.baseline is not None:
        sides["offtake-base"] = args.baseline.resolve() / "worker"
    best: dict[str, float] = {}
    for _ in range(args.turns):
        for name, worker in sides.items():
            env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(worker), str(BENCH)))}
            argv = [sys.executable, __file__, "--child", "--workload", args.workload]
            argv += ["--records", str(args.records), "--reps", str(args.reps)]
            out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
            us = float(out.stdout.split()[-1])
            best[name] = min(best.get(name, us), us)
            print(f"{name:13} {args.workload}: {us:.2f} us/record (processing thread)")
    for name, us in best.items():
        print(f"best {name:13} {us:.2f} us/record")


if __name__ == "__main__":
    main()
