"""The ``bed`` fixture: each broker behaviour test runs on the memory broker and on Kafka.

The Kafka variant uses the test bed's session-wide broker (started once, on first use) and is
marked ``kafka``, so ``-m "not kafka"`` runs the memory half alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.brokers import BrokerBed, KafkaBed, MemoryBed


@pytest.fixture(params=["memory", pytest.param("kafka", marks=pytest.mark.kafka)])
def bed(request: pytest.FixtureRequest) -> Iterator[BrokerBed]:
    label = request.node.originalname.removeprefix("test_")
    made: BrokerBed
    if request.param == "kafka":
        made = KafkaBed(label, request.getfixturevalue("kafka_broker"))
    else:
        made = MemoryBed(label)
    try:
        yield made
    finally:
        made.close()
