"""Consumer lag of a pipeline's group, from the Kafka admin API.

Lag in messages is log-end offset minus committed offset, per partition, summed (as the workers'
``offtake_consumer_lag_messages``). Lag in seconds is the age of the oldest record not yet
committed: the timestamp of the record at the committed offset of each lagging partition, read
with a group-less consumer (assign, not subscribe, so the probe never joins the group).

The operator measures from the broker rather than scraping the workers because the broker
knows the lag of partitions no worker holds (paused, crashed, not yet assigned).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from offtake.contract import (
    ConfigError,
    ConsumerLike,
    PipelineSpec,
    client_config,
    is_topic_pattern,
    matching_topics,
    operator_client_properties,
    read_timestamps,
)
from offtake.contract import TopicPartition as OfftakeTP

TP = tuple[str, int]

LATEST: Any = OffsetSpec.latest()  # type: ignore[no-untyped-call]
EARLIEST: Any = OffsetSpec.earliest()  # type: ignore[no-untyped-call]


class KafkaAccessError(RuntimeError):
    """The broker could not answer; the message names the pipeline's group or topic."""


@dataclass(frozen=True)
class LagReport:
    #: None in queue mode: a share group commits no offsets to count from (see measure_lag).
    lag: int | None
    lag_seconds: float | None
    partitions: int


def compute_lag(
    end: Mapping[TP, int],
    committed: Mapping[TP, int],
    start: Mapping[TP, int],
    start_from: str,
) -> dict[TP, int]:
    """Messages behind per partition.

    A partition without a committed offset is behind by everything the group will read there:
    the whole retained log with ``startFrom: earliest``, nothing with ``latest``.
    """
    out: dict[TP, int] = {}
    for tp, log_end in end.items():
        if tp in committed and committed[tp] >= 0:
            position = committed[tp]
        elif start_from == "earliest":
            position = start.get(tp, 0)
        else:
            position = log_end
        out[tp] = max(0, log_end - position)
    return out


def lag_seconds(oldest_timestamps_ms: Mapping[TP, int], now_ms: int) -> float:
    if not oldest_timestamps_ms:
        return 0.0
    return max(0.0, (now_ms - min(oldest_timestamps_ms.values())) / 1000.0)


#: librdkafka's own log lines (a broker that cannot be resolved logs several per second) go
#: here, quiet by default: the operator reports lag errors itself, once per distinct error.
LIBRDKAFKA_LOG = logging.getLogger("offtake.operator.librdkafka")
LIBRDKAFKA_LOG.setLevel(logging.CRITICAL)


def admin_config(
    pipeline: PipelineSpec, secret: Mapping[str, str], timeout: float
) -> dict[str, Any]:
    """The operator's clients: connection and security properties only (an allowlist,
    offtake.config.client_properties), whatever else the tenant's kafka.config sets. The
    operator is shared and privileged; the tenant's tuning is for the tenant's workers."""
    try:
        conf = client_config(pipeline, secret, LIBRDKAFKA_LOG)  # refuses code-loading properties
    except ConfigError as exc:
        raise KafkaAccessError(str(exc)) from None
    conf = operator_client_properties(conf)
    conf["socket.timeout.ms"] = int(timeout * 1000)
    conf.setdefault("client.id", "offtake-operator")
    return conf


_ADMINS: OrderedDict[str, AdminClient] = OrderedDict()
_ADMINS_LOCK = threading.Lock()
#: Admin clients kept (one per distinct cluster and configuration, least recently used out).
MAX_ADMIN_CLIENTS = 32


def admin_client(conf: Mapping[str, Any]) -> AdminClient:
    """A shared AdminClient per configuration: pipelines on the same cluster share one (each
    client holds threads and broker connections, too many to make one per measurement)."""
    key = json.dumps({k: v for k, v in conf.items() if k != "logger"}, sort_keys=True, default=str)
    with _ADMINS_LOCK:
        admin = _ADMINS.pop(key, None) or AdminClient(dict(conf))
        _ADMINS[key] = admin
        while len(_ADMINS) > MAX_ADMIN_CLIENTS:
            _ADMINS.popitem(last=False)
        return admin


def await_result(future: Any, timeout: float, what: str) -> Any:
    try:
        return future.result(timeout=timeout)
    except KafkaException as exc:
        raise KafkaAccessError(f"{what}: {exc.args[0] if exc.args else exc}") from None
    except TimeoutError:
        raise KafkaAccessError(f"{what}: no answer from the brokers within {timeout:g}s") from None


def topic_partitions(admin: AdminClient, topics: tuple[str, ...], timeout: float) -> list[TP]:
    """Every partition of the source topics; a pattern (``^...``) stands for every existing
    topic it matches, as the workers' subscription does (none yet: no partitions)."""
    out: list[TP] = []
    if any(is_topic_pattern(t) for t in topics):
        try:
            existing = admin.list_topics(timeout=timeout).topics
        except KafkaException as exc:
            raise KafkaAccessError(f"listing topics: cannot read metadata: {exc.args[0]}") from None
        topics = tuple(matching_topics(topics, existing))
    for topic in topics:
        try:
            meta = admin.list_topics(topic=topic, timeout=timeout)
        except KafkaException as exc:
            raise KafkaAccessError(
                f"topic {topic!r}: cannot read metadata: {exc.args[0]}"
            ) from None
        info = meta.topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            err = info.error if info is not None else "not found"
            raise KafkaAccessError(f"topic {topic!r}: {err}")
        out += [(topic, p) for p in sorted(info.partitions)]
    return out


def list_offsets(
    admin: AdminClient, tps: list[TP], spec: OffsetSpec, timeout: float
) -> dict[TP, int]:
    if not tps:
        return {}
    futures = admin.list_offsets(
        {TopicPartition(t, p): spec for t, p in tps}, request_timeout=timeout
    )
    return {
        (tp.topic, tp.partition): await_result(
            f, timeout, f"offsets of {tp.topic}[{tp.partition}]"
        ).offset
        for tp, f in futures.items()
    }


def committed_offsets(
    admin: AdminClient, group: str, tps: list[TP], timeout: float
) -> dict[TP, int]:
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in tps])
    futures = admin.list_consumer_group_offsets([request], request_timeout=timeout)
    result = await_result(futures[group], timeout, f"committed offsets of group {group!r}")
    return {
        (tp.topic, tp.partition): tp.offset
        for tp in result.topic_partitions
        if tp.error is None and tp.offset >= 0
    }


def oldest_timestamps(
    conf: Mapping[str, Any], positions: Mapping[TP, int], timeout: float
) -> dict[TP, int]:
    """Timestamp (ms) of the record at each position; partitions that do not answer are left out."""
    if not positions:
        return {}
    probe = Consumer(
        {
            **{k: v for k, v in conf.items() if k != "client.id"},
            # Never joined: the probe assigns partitions, it never subscribes.
            "group.id": "offtake-operator-lag-probe",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    try:
        # The worker's own probe reads the same way (offtake.kafka.oldest_record).
        wanted = {OfftakeTP(t, p): off for (t, p), off in positions.items()}
        found = read_timestamps(cast(ConsumerLike, probe), wanted, TopicPartition, timeout)
        return {(tp.topic, tp.partition): ts for tp, ts in found.items()}
    finally:
        probe.close()


def measure_lag(pipeline: PipelineSpec, secret: Mapping[str, str], timeout: float) -> LagReport:
    """Blocking: run it in a thread."""
    conf = admin_config(pipeline, secret, timeout)
    admin = admin_client(conf)
    tps = topic_partitions(admin, pipeline.source.topics, timeout)
    if pipeline.source.is_share_group:
        # Queue mode: a share group has no committed offsets (its start offsets need
        # DescribeShareGroupOffsets, which confluent-kafka's AdminClient does not have), so
        # no lag rather than a wrong one; the workers export the age of records when acquired.
        return LagReport(lag=None, lag_seconds=None, partitions=len(tps))
    end = list_offsets(admin, tps, LATEST, timeout)
    start = list_offsets(admin, tps, EARLIEST, timeout)
    committed = committed_offsets(admin, pipeline.source.group_id, tps, timeout)
    behind = compute_lag(end, committed, start, pipeline.source.start_from)
    positions = {tp: committed.get(tp, start.get(tp, 0)) for tp, n in behind.items() if n > 0}
    stamps = oldest_timestamps(conf, positions, timeout=min(timeout, 5.0))
    return LagReport(
        lag=sum(behind.values()),
        lag_seconds=round(lag_seconds(stamps, int(time.time() * 1000)), 3),
        partitions=len(tps),
    )
