"""The Offtake test kit: run pipelines and processing functions without Kafka.

Three levels, from small to large::

    from offtake.testing import MemoryBroker, PipelineHarness, process, run_pipeline

    # 1. one processing function on one record, with the worker's calling convention
    assert process("mypkg.enrich:handle", {"id": 1}) == [{"id": 1, "ok": True}]

    # 2. a whole manifest against an in-memory broker, until every input is committed
    broker = MemoryBroker()
    broker.create_topic("orders", partitions=4)
    for i in range(100):
        broker.produce("orders", {"id": i}, key=str(i))
    run = run_pipeline("pipeline.yaml", broker, workers=2)
    assert run.ok and len(run.outputs) == 100

    # avro | protobuf | jsonschema without a registry: confluent-kafka's in-memory one
    assert process(handle, {"id": 1}, format="avro", schema=ORDER_AVSC) == [...]
    with PipelineHarness("avro-pipeline.yaml", broker) as h:   # h.schema_registry: in memory
        h.produce(encode("avro", {"id": 1}, ORDER_AVSC, registry=h.schema_registry))

    # 3. finer control: add, stop and kill workers while records flow
    with PipelineHarness("pipeline.yaml", broker) as h:
        h.add_worker(); h.add_worker()
        h.kill_worker(0)          # SIGKILL: no commit, no leave; its partitions are lost
        h.wait_until_committed()
        run = h.result()

The names below are re-exported from where they are made (offtake.harness and the memory
broker, offtake.kafka.memory): import them from here; the modules behind them may move.
"""

from offtake.harness import (
    PipelineHarness,
    PipelineRun,
    PipelineTimeout,
    WorkerHandle,
    decode_output,
    encode,
    headers_of,
    in_memory_registry,
    process,
    run_pipeline,
)
from offtake.kafka.memory import MemoryBroker, MemoryMessage

__all__ = [
    "MemoryBroker",
    "MemoryMessage",
    "PipelineHarness",
    "PipelineRun",
    "PipelineTimeout",
    "WorkerHandle",
    "decode_output",
    "encode",
    "headers_of",
    "in_memory_registry",
    "process",
    "run_pipeline",
]
