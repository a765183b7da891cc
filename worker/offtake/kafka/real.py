"""The production client factory: confluent-kafka as it is."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, cast

import confluent_kafka
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType

from offtake.kafka.protocols import ConsumerLike, ProducerLike, ShareConsumerLike
from offtake.kafka.share_source import ShareGroupUnavailable


class ConfluentClients:
    """Builds confluent-kafka clients; the engine never imports confluent_kafka itself."""

    def consumer(self, config: dict[str, Any]) -> ConsumerLike:
        return cast(ConsumerLike, confluent_kafka.Consumer(config))

    def producer(self, config: dict[str, Any]) -> ProducerLike:
        return cast(ProducerLike, confluent_kafka.Producer(config))

    def share_consumer(self, config: dict[str, Any]) -> ShareConsumerLike:
        share_consumer = getattr(confluent_kafka, "ShareConsumer", None)
        if share_consumer is None:  # confluent-kafka before 2.15
            raise ShareGroupUnavailable(
                f"confluent-kafka {confluent_kafka.version()[0]} has no ShareConsumer: "
                "spec.source.groupType share needs confluent-kafka 2.15 or later"
            )
        return cast(ShareConsumerLike, share_consumer(config))

    def configure_share_group(
        self, config: dict[str, Any], group: str, settings: dict[str, str]
    ) -> int | None:
        """incremental_alter_configs on the GROUP resource (the Python AdminClient has no
        share-group calls of its own); then the group's lock duration, as the broker says."""
        admin = AdminClient(
            {k: v for k, v in config.items() if k != "group.id" and not k.startswith("share.")}
        )
        entries = [
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            for name, value in settings.items()
        ]
        resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
        for future in admin.incremental_alter_configs([resource], request_timeout=15).values():
            future.result()
        described = admin.describe_configs([ConfigResource(ResourceType.GROUP, group)])
        for future in described.values():
            lock = future.result().get("share.record.lock.duration.ms")
            if lock is not None and lock.value:
                return int(lock.value)
        return None

    def topic_partition(self, topic: str, partition: int, offset: int = -1001) -> Any:
        return confluent_kafka.TopicPartition(topic, partition, offset)


#: Errors that are a broker's definite answer, not a failure to reach it: retrying the same
#: credentials or certificates gets the same answer, so the worker stops waiting at once.
_REFUSALS = {
    -169: "authentication",  # _AUTHENTICATION: e.g. SCRAM with a wrong password or user
    -181: "tls",  # _SSL: e.g. the broker's certificate is not signed by the CA we trust
}


@dataclass(frozen=True)
class ReachFailure:
    """Why no broker answered: ``kind`` is "unreachable", "authentication" or "tls"."""

    kind: str
    message: str


def reach_brokers(
    config: dict[str, Any], timeout_s: float, abort: threading.Event
) -> ReachFailure | None:
    """Wait until some broker of ``config`` answers a metadata request, for up to ``timeout_s``.

    Returns None once one answered (or when ``abort`` is set), else why not: the last error
    seen, e.g. "Connect to ipv4#127.0.0.1:9092 failed: Connection refused". An authentication
    or TLS error ends the wait at once (see _REFUSALS). A throwaway client of the worker's own
    settings (security included) asks, on this thread only, and is closed before returning; it
    never joins the group. Its log lines go where ``config["logger"]`` says.
    """
    errors: list[confluent_kafka.KafkaError] = []
    probe = confluent_kafka.Consumer({**config, "error_cb": errors.append})
    deadline = time.monotonic() + timeout_s
    last = "no broker answered"
    try:
        while not abort.is_set():
            refused = next((e for e in errors if e.code() in _REFUSALS), None)
            if refused is not None:
                return ReachFailure(_REFUSALS[refused.code()], refused.str())
            left = deadline - time.monotonic()
            if left <= 0:
                return ReachFailure("unreachable", errors[-1].str() if errors else last)
            try:
                probe.list_topics(timeout=min(1.0, left))
                return None
            except confluent_kafka.KafkaException as exc:
                last = exc.args[0].str() if exc.args else str(exc)
            probe.poll(0)  # serves error_cb (the cause, e.g. connection refused) and log lines
            abort.wait(min(0.2, max(0.0, deadline - time.monotonic())))
        return None
    finally:
        probe.close()


def missing_topics(config: dict[str, Any], topics: list[str], timeout_s: float) -> list[str]:
    """Which of ``topics`` the brokers do not list (absent, or not visible to this principal).

    Asked once, by a throwaway client of the worker's own settings that never joins the group.
    Raises confluent_kafka.KafkaException if the metadata request fails.
    """
    probe = confluent_kafka.Consumer(config)
    try:
        known = probe.list_topics(timeout=timeout_s).topics
    finally:
        probe.close()
    return [t for t in topics if t not in known or known[t].error is not None]
