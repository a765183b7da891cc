"""Short variant of chaos scenario 6 (the long one: ``python bench/chaos.py``): the sidecar
processor SIGKILLed, then frozen, under a real worker on real Kafka."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.chaos.s06_sidecar_outages import sidecar_outages
from support.reports import report

from offtake_testbed.kafka import KafkaBroker

pytestmark = pytest.mark.chaos


def test_a_sidecar_that_crashes_or_hangs_costs_no_record(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    outcome = sidecar_outages(kafka_broker, tmp_path, records=3_000, outage=5.0)
    report("chaos-sidecar", **vars(outcome))
    outcome.check()
