"""pytest fixtures for a real Kafka broker: ``kafka_broker`` (session) and ``topic_factory``,
``secured_kafka_broker`` (session) for SASL/SCRAM and TLS clients, and ``kafka_cluster``
(session) with three brokers for failover tests.

Register with ``pytest_plugins = ["offtake_testbed.pytest_plugin"]`` in a conftest.py. Tests
that use the broker are marked ``kafka`` automatically, so ``-m "not kafka"`` deselects them.
A missing Java, Maven or network fails these tests loudly; it never skips them.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Protocol

import pytest

from .apicurio import ApicurioRegistry, ApicurioTestbedError
from .kafka import KafkaBroker, KafkaTestbedError, install_kafka
from .kafka_cluster import KafkaCluster

__all__ = [
    "SCRAM_USER",
    "TopicFactory",
    "kafka_broker",
    "kafka_cluster",
    "schema_registry",
    "secured_kafka_broker",
    "topic_factory",
]

#: The SCRAM-SHA-512 user of ``secured_kafka_broker``; its password is
#: ``secured_kafka_broker.scram_users[SCRAM_USER]``, new for every session.
SCRAM_USER = "offtake-scram-user"
_BROKER_FIXTURES = ("kafka_broker", "secured_kafka_broker", "kafka_cluster")

# Kafka topic names: at most 249 of [a-zA-Z0-9._-]; keep room for the unique suffix.
_ILLEGAL_TOPIC_CHARS = re.compile(r"[^a-zA-Z0-9._-]+")
_MAX_PREFIX = 180


class TopicFactory(Protocol):
    """Creates a uniquely named topic on the test broker and returns its name."""

    def __call__(
        self,
        partitions: int = 1,
        config: Mapping[str, str] | None = None,
        prefix: str | None = None,
    ) -> str: ...


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if set(_BROKER_FIXTURES) & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.kafka)


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """A started single-node KRaft broker shared by the whole test session."""
    yield from _running(KafkaBroker())


@pytest.fixture(scope="session")
def secured_kafka_broker() -> Iterator[KafkaBroker]:
    """A second broker whose clients authenticate: SCRAM-SHA-512 user ``SCRAM_USER`` on
    ``listener_bootstrap(SCRAM_LISTENER)`` and, over TLS, ``SCRAM_TLS_LISTENER``; TLS on
    ``TLS_LISTENER`` and TLS with client certificates on ``MTLS_LISTENER`` (CA: ``ca_pem``).
    Its plain listener (``bootstrap``) is for the tests' own producers and checks.

    A broker of its own rather than more listeners on ``kafka_broker``: the default broker
    starts exactly as before, with nothing to generate or configure, and the cost of this one
    (a JVM start, some seconds) is paid only by sessions that select a test using it.
    """
    # Distinctive and new every session, so a test can grep outputs for it (it must never
    # appear) without matching anything else by chance.
    password = f"offtake-canary-{uuid.uuid4().hex}"
    yield from _running(KafkaBroker(heap="512m", scram_users={SCRAM_USER: password}, tls=True))


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[KafkaCluster]:
    """Three KRaft brokers (replication factor 3, min.insync.replicas=2) whose nodes a test
    may stop, kill and start (:meth:`KafkaCluster.kill_node`, ``start_node``, ``restart_all``).
    A test that takes nodes down brings them back; the fixture fails the next test otherwise.
    Three JVMs of 384 MiB heap each: only sessions that select such a test pay for them."""
    cluster = KafkaCluster()
    began = time.monotonic()
    problem: str | None = None
    try:
        install_kafka(cluster.version)
        cluster.start()
    except KafkaTestbedError as exc:
        problem = str(exc)
    if problem is not None:
        pytest.fail(f"the Kafka testbed could not start a cluster: {problem}", pytrace=False)
    print(f"\nKafka cluster on {cluster.bootstrap} ready in {time.monotonic() - began:.1f}s")
    try:
        yield cluster
    finally:
        cluster.stop()


def _running(broker: KafkaBroker) -> Iterator[KafkaBroker]:
    began = time.monotonic()
    problem = _start(broker)
    if problem is not None:
        # Outside the except block, so pytest shows just the message, not a chained traceback.
        pytest.fail(f"the Kafka testbed could not start a broker: {problem}", pytrace=False)
    print(
        f"\nKafka {broker.version} on {broker.bootstrap} ready in {time.monotonic() - began:.1f}s"
    )
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[ApicurioRegistry]:
    """A started Apicurio Registry (Confluent-compatible API at ``.url``), shared by the whole
    session; built from Maven Central on first use and cached. Its storage is a database file
    of the session's own (``durable``), so a test may stop and restart its process and the
    schemas, with their ids, are still there, as with a production registry's storage."""
    began = time.monotonic()
    registry = ApicurioRegistry(durable=True)
    problem: str | None = None
    try:
        registry.start()
    except ApicurioTestbedError as exc:
        problem = str(exc)
    if problem is not None:
        pytest.fail(f"the test bed could not start a schema registry: {problem}", pytrace=False)
    print(
        f"\nApicurio Registry {registry.version} on {registry.url} "
        f"ready in {time.monotonic() - began:.1f}s"
    )
    try:
        yield registry
    finally:
        registry.stop()


@pytest.fixture
def topic_factory(
    kafka_broker: KafkaBroker, request: pytest.FixtureRequest
) -> Iterator[TopicFactory]:
    """Create topics named after the test (plus a unique suffix); delete them afterwards."""
    created: list[str] = []

    def make(
        partitions: int = 1,
        config: Mapping[str, str] | None = None,
        prefix: str | None = None,
    ) -> str:
        stem = _ILLEGAL_TOPIC_CHARS.sub("-", prefix or request.node.name).strip("-.")
        name = f"{stem[:_MAX_PREFIX] or 'topic'}-{uuid.uuid4().hex[:10]}"
        kafka_broker.create_topic(name, partitions, config)
        created.append(name)
        return name

    yield make
    _delete_all(kafka_broker, created)


def _start(broker: KafkaBroker) -> str | None:
    """Install (if needed) and start; return the reason on failure."""
    try:
        install_kafka(broker.version)
        broker.start()
    except KafkaTestbedError as exc:
        return str(exc)
    return None


def _delete_all(broker: KafkaBroker, names: list[str]) -> None:
    # A test may have deleted its topic itself, or stopped the broker on purpose.
    if not broker.is_running():
        return
    for name in names:
        broker.delete_topic(name, missing_ok=True)
