"""The ``contract`` fixture: one sink implementation per parameter, each with a destination
the test can read back. Variants needing the real Kafka broker or a JVM carry the ``kafka``
and ``spark`` markers, so ``-m "not kafka and not spark"`` keeps the fast ones."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .sinks import (
    Contract,
    LogCase,
    MemoryKafkaCase,
    RealKafkaCase,
    RealKafkaTransactionalCase,
    SinkCase,
    SparkParquetCase,
)

SINKS = [
    pytest.param("log", id="log"),
    pytest.param("kafka-memory", id="kafka-memory"),
    pytest.param("kafka-real", id="kafka-real", marks=pytest.mark.kafka),
    pytest.param("kafka-exactly-once", id="kafka-exactly-once", marks=pytest.mark.kafka),
    pytest.param("spark-parquet", id="spark-parquet", marks=pytest.mark.spark),
]


@pytest.fixture(params=SINKS)
def contract(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Contract]:
    """A started sink of each implementation, driven as the engine drives it."""
    case: SinkCase
    if request.param == "log":
        case = LogCase(request.getfixturevalue("capsys"))
    elif request.param == "kafka-memory":
        case = MemoryKafkaCase()
    elif request.param == "kafka-real":
        broker = request.getfixturevalue("kafka_broker")
        topic = request.getfixturevalue("topic_factory")(partitions=3)
        case = RealKafkaCase(broker.bootstrap, topic)
    elif request.param == "kafka-exactly-once":
        broker = request.getfixturevalue("kafka_broker")
        topic = request.getfixturevalue("topic_factory")(partitions=3)
        case = RealKafkaTransactionalCase(broker.bootstrap, topic)
    else:
        case = SparkParquetCase(request.getfixturevalue("spark"), tmp_path / "table")
    contract = Contract(case)
    try:
        yield contract
    finally:
        case.cleanup()
