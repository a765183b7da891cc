"""Short variants of chaos scenarios 3 and 5 (the long ones: ``python bench/chaos.py``):
the Kafka sink's brokers unreachable under a running worker, and bad input (fuzzed payloads
in every source format, records too large for the output, processors that raise or return
what no sink can send). Nothing lost, nothing stalls, nothing dead-lettered for an outage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.chaos import fuzzed_payloads, settled_without_stall, sink_broker_outage
from support.reports import report

from offtake_testbed.kafka import KafkaBroker
from offtake_testbed.kafka_cluster import KafkaCluster

pytestmark = pytest.mark.chaos


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
    values = fuzzed_payloads(seed=hash(fmt) & 0xFFFF, count=600)
    delivered, dead, took = settled_without_stall(
        kafka_broker, tmp_path, f"fuzz-{fmt}", values, fmt=fmt
    )
    report(
        "chaos-fuzzed-payloads",
        format=fmt,
        records=len(values),
        delivered=delivered,
        dead=dead,
        seconds=took,
    )
    assert delivered + dead == len(values)
    if fmt == "bytes":
        assert dead == 0  # every byte string is a valid bytes record
    else:
        assert dead > 0  # the fuzz really held undecodable records


def test_records_larger_than_the_outputs_limit_go_to_the_error_policy(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    values = [json.dumps({"id": i, "big": i % 50 == 0}).encode() for i in range(500)]
    delivered, dead, took = settled_without_stall(
        kafka_broker,
        tmp_path,
        "oversize",
        values,
        processor="support.processors:inflate",
        out_config={"max.message.bytes": "100000"},
    )
    report("chaos-oversize", records=len(values), delivered=delivered, dead=dead, seconds=took)
    assert (delivered, dead) == (490, 10)


def test_a_processor_that_raises_or_returns_unsendable_values_stalls_nothing(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    values = [json.dumps({"id": i}).encode() for i in range(1, 771)]
    delivered, dead, took = settled_without_stall(
        kafka_broker, tmp_path, "misbehave", values, processor="support.processors:misbehave"
    )
    failing = sum(1 for i in range(1, 771) if i % 7 == 0 or i % 11 == 0)
    report("chaos-bad-processor", records=len(values), delivered=delivered, dead=dead, seconds=took)
    assert (delivered, dead) == (len(values) - failing, failing)
