"""What only the brokers know, read from where kubectl runs: positions, owners, DLQ sizes.

Read-only: the clients are the operator's (connection and security properties only, from the
pipeline's spec and its Kafka Secret), the consumers assign and never join or commit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import confluent_kafka
from confluent_kafka.admin import AdminClient

from offtake.contract import (
    ConfigError,
    PartitionPosition,
    PipelineSpec,
    group_positions,
    parse_pipeline,
)

from ..kafka_secret import KafkaSecretError, map_secret, with_cluster_ca
from ..lag import KafkaAccessError, admin_config
from .cluster import Cluster
from .errors import KafkaUnreachableError, PluginError

#: Seconds for each Kafka request from the terminal (a broker not reachable from here is said
#: so after this, and the rest of the command still shows what the API server knows).
KAFKA_TIMEOUT = 5.0


@dataclass(frozen=True)
class KafkaAccess:
    spec: PipelineSpec
    conf: dict[str, Any]


def pipeline_spec(manifest: Mapping[str, Any]) -> PipelineSpec:
    try:
        return parse_pipeline(manifest)
    except ConfigError as exc:
        name = (manifest.get("metadata") or {}).get("name")
        raise PluginError(f"ConsumerPipeline {name!r}: the spec does not load: {exc}") from None


def kafka_access(cluster: Cluster, spec: PipelineSpec, timeout: float) -> KafkaAccess:
    """The pipeline's cluster as the operator's clients see it (its Secret read with the
    user's own rights: who may not read it may not read the topics either)."""
    ref, ca_ref = spec.kafka.secret_ref, spec.kafka.ca_secret_ref
    try:
        secret = None
        ns = cluster.namespace
        if ref is not None:
            data = cluster.secret_data(ref.name, "spec.kafka.secretRef")
            secret = map_secret(ns, ref.name, data)
        if ca_ref is not None:
            data = cluster.secret_data(ca_ref.name, "spec.kafka.caSecretRef")
            secret = with_cluster_ca(secret, ns, ca_ref.name, data)
        conf = admin_config(spec, {} if secret is None else secret.properties, timeout)
    except (KafkaSecretError, KafkaAccessError) as exc:
        raise PluginError(str(exc)) from None
    conf["client.id"] = "offtake-kubectl"
    return KafkaAccess(spec, conf)


def check_reachable(access: KafkaAccess, timeout: float) -> AdminClient:
    admin = AdminClient({k: v for k, v in access.conf.items()})
    try:
        admin.list_topics(timeout=timeout)
    except confluent_kafka.KafkaException as exc:
        raise KafkaUnreachableError(
            f"Kafka at {access.spec.kafka.bootstrap_servers} is not reachable from here "
            f"({exc.args[0].str() if exc.args else exc})"
        ) from None
    return admin


def positions(access: KafkaAccess) -> list[PartitionPosition]:
    spec = access.spec
    try:
        return group_positions(access.conf, spec.source.group_id, list(spec.source.topics))
    except (confluent_kafka.KafkaException, LookupError) as exc:
        raise KafkaUnreachableError(f"reading the group's positions: {exc}") from None


def owners(admin: AdminClient, group: str, timeout: float) -> dict[tuple[str, int], str]:
    """(topic, partition) -> the member that holds it: its group.instance.id (the pod's name
    with static membership), else its client host."""
    futures = admin.describe_consumer_groups([group], request_timeout=timeout)
    try:
        desc = futures[group].result(timeout=timeout)
    except (confluent_kafka.KafkaException, TimeoutError):
        return {}
    out: dict[tuple[str, int], str] = {}
    for member in desc.members or []:
        who = member.group_instance_id or member.host.lstrip("/")
        for tp in (member.assignment.topic_partitions if member.assignment else []) or []:
            out[(tp.topic, tp.partition)] = who
    return out


def topic_size(admin: AdminClient, topic: str, access: KafkaAccess, timeout: float) -> int | None:
    """Records retained in ``topic`` (None if it does not exist)."""
    meta = admin.list_topics(topic=topic, timeout=timeout).topics.get(topic)
    if meta is None or meta.error is not None:
        return None
    conf = {k: v for k, v in access.conf.items() if not callable(v)}
    conf.update({"group.id": "offtake-kubectl", "enable.auto.commit": False})
    consumer = confluent_kafka.Consumer(conf)
    try:
        total = 0
        for p in meta.partitions:
            low, high = consumer.get_watermark_offsets(
                confluent_kafka.TopicPartition(topic, p), timeout=timeout, cached=False
            )
            total += max(0, high - low)
        return total
    finally:
        consumer.close()
