"""Short variants of chaos scenarios 1 and 2 (the long ones: ``python bench/chaos.py``):
workers SIGKILLed at random, and brokers of a three-node cluster killed and restarted under
running workers. Nothing may be lost; duplicates stay within faults x maxInFlightMessages."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.chaos.s01_worker_kills import worker_kills
from support.chaos.s02_broker_failover import broker_failover
from support.reports import report

from offtake_testbed.kafka import KafkaBroker
from offtake_testbed.kafka_cluster import KafkaCluster

pytestmark = pytest.mark.chaos


def test_workers_sigkilled_at_random_lose_nothing(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    outcome = worker_kills(kafka_broker, tmp_path, records=10_000, kills=2, every=3.0)
    report("chaos-worker-kills", **vars(outcome))
    outcome.check()


def test_leader_broker_killed_then_all_restarted_workers_ride_it_out(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    # The full restart of all three brokers (~40 s more) runs in bench/chaos.py only.
    outcome = broker_failover(
        kafka_cluster, tmp_path, records=6_000, outage=3.0, full_restart=False
    )
    report("chaos-broker-failover", **vars(outcome))
    outcome.check()
