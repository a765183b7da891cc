"""Short variants of chaos scenarios 3 and 5 (the long ones: ``python bench/chaos.py``):
the Kafka sink's brokers unreachable under a running worker, and bad input (fuzzed payloads
in every source format, avro, protobuf and jsonschema included, records too large for the
output, processors that raise, return what no sink can send, hang past
processor.timeoutSeconds or leak past processor.maxMemoryMiB, or leak in the worker's thread
until the kernel's OOM killer ends it). Nothing lost, nothing stalls,
nothing dead-lettered for an outage."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import cgroups
from support.chaos.s03_sink_outages import sink_broker_outage
from support.chaos.s05_bad_input import (
    failing_processor,
    fuzzed_format,
    fuzzed_schema_format,
    hung_processor,
    leak_under_memory_limit,
    leaking_processor,
    oversize_records,
)
from support.reports import report
from support.schemas import FORMATS

from offtake_testbed.apicurio import ApicurioRegistry
from offtake_testbed.kafka import KafkaBroker
from offtake_testbed.kafka_cluster import KafkaCluster

pytestmark = pytest.mark.chaos
# Why no memory cgroup can be made here (each check creates and removes a probe group).
NO_CGROUP = cgroups.unavailable()


def test_output_brokers_unreachable_backpressure_holds_memory_and_nothing_dead_letters(
    kafka_broker: KafkaBroker, kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    pids = [kafka_cluster.node_pid(n) for n in kafka_cluster.node_ids]
    outcome = sink_broker_outage(
        kafka_broker, kafka_cluster, pids, tmp_path, records=20_000, outage=6.0
    )
    report("chaos-sink-outage", **vars(outcome))
    outcome.check()


@pytest.mark.parametrize("fmt", ["json", "string", "bytes"])
def test_fuzzed_payloads_settle_through_the_error_policy(
    fmt: str, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    outcome = fuzzed_format(kafka_broker, tmp_path, fmt, count=600, seed=hash(fmt) & 0xFFFF)
    report("chaos-fuzzed-payloads", **vars(outcome))
    outcome.check()


@pytest.mark.parametrize("fmt", FORMATS)
def test_fuzzed_schema_payloads_settle_through_the_error_policy(
    fmt: str, kafka_broker: KafkaBroker, schema_registry: ApicurioRegistry, tmp_path: Path
) -> None:
    outcome = fuzzed_schema_format(
        kafka_broker, tmp_path, fmt, count=400, seed=len(fmt), registry_url=schema_registry.url
    )
    report("chaos-fuzzed-schema-payloads", **vars(outcome))
    outcome.check()


def test_records_larger_than_the_outputs_limit_go_to_the_error_policy(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    outcome = oversize_records(kafka_broker, tmp_path, count=500)
    report("chaos-oversize", **vars(outcome))
    outcome.check()


def test_a_processor_that_raises_or_returns_unsendable_values_stalls_nothing(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    outcome = failing_processor(kafka_broker, tmp_path, count=770)
    report("chaos-bad-processor", **vars(outcome))
    outcome.check()


def test_a_hung_processor_is_bounded_by_its_timeout_and_the_partitions_move_on(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    outcome = hung_processor(kafka_broker, tmp_path, count=400, hangs=3, timeout_seconds=1.0)
    report("chaos-hung-processor", **vars(outcome))
    outcome.check()


def test_a_leaking_processor_is_recycled_past_max_memory_and_loses_nothing(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    outcome = leaking_processor(kafka_broker, tmp_path, count=500, leak_kib=1024)
    report("chaos-leaking-processor", **vars(outcome))
    outcome.check()


@pytest.mark.skipif(NO_CGROUP is not None, reason=f"{NO_CGROUP}")
def test_a_worker_oom_killed_by_its_memory_limit_resumes_and_loses_nothing(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    outcome = leak_under_memory_limit(kafka_broker, tmp_path, count=3000, seconds=8.0)
    report("chaos-oom-killed-worker", **vars(outcome))
    outcome.check()
