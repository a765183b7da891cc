"""A consumer group's members and offsets through the Kafka admin API (blocking calls).

The operator's rewind (:mod:`offtake_operator.rewind`) uses these, through the
:class:`~offtake_operator.kafka_gateway.KafkaGateway`, to wait for an empty group and move its
offsets; the redrive (:mod:`offtake_operator.redrive`) reads its progress.
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import (
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from offtake.contract import PipelineSpec, RedriveResult, read_progress

from .lag import (
    EARLIEST,
    LATEST,
    TP,
    KafkaAccessError,
    admin_client,
    admin_config,
    await_result,
    list_offsets,
    topic_partitions,
)
from .operator_spec import Rewind


class GroupNotEmptyError(KafkaAccessError):
    """The group still has members, so its offsets must not be touched yet."""


def group_members(pipeline: PipelineSpec, secret: Mapping[str, str], timeout: float) -> int:
    """Members of the pipeline's consumer group (0 for an empty or unknown group). Blocking."""
    admin = admin_client(admin_config(pipeline, secret, timeout))
    return _members(admin, pipeline.source.group_id, timeout)


def _members(admin: AdminClient, group: str, timeout: float) -> int:
    futures = admin.describe_consumer_groups([group], request_timeout=timeout)
    desc = await_result(futures[group], timeout, f"group {group!r}")
    if desc.state in (ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD) and not desc.members:
        return 0
    return max(len(desc.members), 1 if desc.state != ConsumerGroupState.UNKNOWN else 0)


def target_offsets(
    admin: AdminClient, tps: list[TP], rewind: Rewind, timeout: float
) -> dict[TP, int]:
    if rewind.to == "earliest":
        return list_offsets(admin, tps, EARLIEST, timeout)
    latest = list_offsets(admin, tps, LATEST, timeout)
    if rewind.to == "latest":
        return latest
    assert rewind.timestamp_ms is not None
    found = list_offsets(admin, tps, OffsetSpec.for_timestamp(rewind.timestamp_ms), timeout)
    # No record at or after the timestamp: start at the end (nothing newer to re-read).
    return {tp: off if off >= 0 else latest[tp] for tp, off in found.items()}


def reset_offsets(
    pipeline: PipelineSpec, secret: Mapping[str, str], rewind: Rewind, timeout: float
) -> dict[TP, int]:
    """Alter the group's offsets for every partition of the source topics. Blocking.

    Raises :class:`GroupNotEmptyError` if a member is still in the group.
    """
    group = pipeline.source.group_id
    admin = admin_client(admin_config(pipeline, secret, timeout))
    members = _members(admin, group, timeout)
    if members:
        raise GroupNotEmptyError(f"group {group!r} still has {members} member(s)")
    tps = topic_partitions(admin, pipeline.source.topics, timeout)
    offsets = target_offsets(admin, tps, rewind, timeout)
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(t, p, off) for (t, p), off in sorted(offsets.items())]
    )
    futures = admin.alter_consumer_group_offsets([request], request_timeout=timeout)
    result = await_result(futures[group], timeout, f"altering offsets of group {group!r}")
    failed = [
        f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in result.topic_partitions if tp.error
    ]
    if failed:
        raise KafkaAccessError(f"altering offsets of group {group!r}: {'; '.join(failed)}")
    return offsets


def redrive_progress(
    pipeline: PipelineSpec,
    secret: Mapping[str, str],
    group: str,
    topic: str,
    request_id: str,
    timeout: float,
) -> RedriveResult | None:
    """What a redrive's group committed on the dead-letter topic: the totals its commits carry
    (None if the topic does not exist). Blocking."""
    try:
        config = admin_config(pipeline, secret, timeout)
        return read_progress(config, group, topic, request_id, timeout)
    except KafkaException as exc:
        raise KafkaAccessError(
            f"redrive group {group!r}: {exc.args[0] if exc.args else exc}"
        ) from None
