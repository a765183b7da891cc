"""Consumer lag of a pipeline's group, from the Kafka admin API.

Lag in messages is log-end offset minus committed offset, per partition, summed (as the workers'
``offtake_consumer_lag_messages``). Lag in seconds is the age of the oldest record not yet
committed: the timestamp of the record at the committed offset of each lagging partition, read
with a group-less consumer (assign, not subscribe, so the probe never joins the group).

The operator measures from the broker rather than scraping the workers because the broker
knows the lag of partitions no worker holds (paused, crashed, not yet assigned).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
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

from .errors import OperatorError

TP = tuple[str, int]

LATEST: Any = OffsetSpec.latest()  # type: ignore[no-untyped-call]
EARLIEST: Any = OffsetSpec.earliest()  # type: ignore[no-untyped-call]


class KafkaAccessError(OperatorError, RuntimeError):
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


#: The largest response the operator's clients read from a tenant's broker (4 MiB: a lag
#: round's metadata and offsets for thousands of partitions fit many times over). A broker
#: announcing a bigger frame is disconnected before the operator allocates it; the tenant's
#: own ``receive.message.max.bytes`` is for the tenant's workers.
OPERATOR_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
#: Properties that make librdkafka connect somewhere other than the tenant's brokers, from
#: the operator's pod and network position: refused (not dropped, which would fail the
#: client later with a less clear message). ``sasl.oauthbearer.method=oidc`` fetches a token
#: from ``sasl.oauthbearer.token.endpoint.url`` (an HTTP request to any URL the tenant names).
OPERATOR_REFUSED_DESTINATIONS = {
    "sasl.oauthbearer.token.endpoint.url": "makes the client send HTTP requests to that URL "
    "from the operator's pod",
    "sasl.oauthbearer.method": "oidc fetches tokens over HTTP from a URL the tenant names",
}


def admin_config(
    pipeline: PipelineSpec, secret: Mapping[str, str], timeout: float
) -> dict[str, Any]:
    """The operator's clients: connection and security properties only (an allowlist,
    offtake.config.client_properties), whatever else the tenant's kafka.config sets. The
    operator is shared and privileged; the tenant's tuning is for the tenant's workers."""
    return admin_config_overriding(pipeline, secret, timeout)[0]


def admin_config_overriding(
    pipeline: PipelineSpec, secret: Mapping[str, str], timeout: float
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """:func:`admin_config`, and each tenant value the operator's own bounds replaced, as
    ``key: tenant value -> operator value`` (the pipeline's status shows them: the tenant sees
    why the operator's reads do not behave as its config says)."""
    try:
        conf = client_config(pipeline, secret, LIBRDKAFKA_LOG)  # refuses code-loading properties
    except ConfigError as exc:
        raise KafkaAccessError(str(exc)) from None
    conf = operator_client_properties(conf)
    for key, reason in OPERATOR_REFUSED_DESTINATIONS.items():
        if key in conf and (key != "sasl.oauthbearer.method" or str(conf[key]).lower() == "oidc"):
            raise KafkaAccessError(
                f'spec.kafka.config["{key}"]: refused for the operator\'s clients: {reason}; '
                "lag and rewinds are unavailable for this pipeline (its workers may use it)"
            )
    # The operator's own bounds, whatever the tenant set: the largest response a broker may
    # send (librdkafka allocates a frame's announced size before reading it), and the time
    # a connection may take to be set up and a request to be answered.
    bounds: dict[str, int] = {
        "receive.message.max.bytes": OPERATOR_MAX_RESPONSE_BYTES,
        "fetch.max.bytes": OPERATOR_MAX_RESPONSE_BYTES - 512,  # librdkafka: <= receive - 512
        "socket.timeout.ms": int(timeout * 1000),
        "socket.connection.setup.timeout.ms": int(timeout * 1000),
    }
    overridden = tuple(
        f"{key}: {conf[key]} -> {value}"
        for key, value in bounds.items()
        if key in conf and str(conf[key]) != str(value)
    )
    conf.update(bounds)
    conf.setdefault("client.id", "offtake-operator")
    return conf, overridden


_ADMINS: OrderedDict[str, AdminClient] = OrderedDict()
_ADMINS_LOCK = threading.Lock()
#: Admin clients kept (one per distinct cluster and configuration, least recently used out).
MAX_ADMIN_CLIENTS = 32


def admin_client(conf: Mapping[str, Any]) -> AdminClient:
    """A shared AdminClient per configuration: pipelines on the same cluster share one (each
    client holds threads and broker connections, too many to make one per measurement)."""
    key = _config_key(conf)
    with _ADMINS_LOCK:
        admin = _ADMINS.pop(key, None) or AdminClient(dict(conf))
        _ADMINS[key] = admin
        while len(_ADMINS) > MAX_ADMIN_CLIENTS:
            _ADMINS.popitem(last=False)
        return admin


def _config_key(conf: Mapping[str, Any]) -> str:
    return json.dumps({k: v for k, v in conf.items() if k != "logger"}, sort_keys=True, default=str)


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


def oldest_timestamps(
    conf: Mapping[str, Any], positions: Collection[tuple[TP, int]], timeout: float
) -> dict[tuple[TP, int], int]:
    """Timestamp (ms) of the record at each (partition, offset); those that do not answer are
    left out. One group-less consumer reads them all: a read takes one offset per partition,
    so several groups at different offsets of a partition take a read each."""
    if not positions:
        return {}
    probe = Consumer(
        {
            **{k: v for k, v in conf.items() if k != "client.id"},
            # Never joined: the probe assigns partitions, it never subscribes.
            "group.id": "offtake-operator-lag-probe",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            # One record a partition is all it needs: fetch little (the broker still sends a
            # whole first batch) and prefetch nothing, or it reads on through the backlog.
            "fetch.message.max.bytes": 1024,
            "queued.min.messages": 1,
        }
    )
    offsets: dict[TP, list[int]] = {}
    for tp, offset in sorted(set(positions)):
        offsets.setdefault(tp, []).append(offset)
    found: dict[tuple[TP, int], int] = {}
    try:
        for layer in range(max(len(v) for v in offsets.values())):
            # The worker's own probe reads the same way (offtake.kafka.oldest_record).
            wanted = {OfftakeTP(t, p): v[layer] for (t, p), v in offsets.items() if len(v) > layer}
            read = read_timestamps(cast(ConsumerLike, probe), wanted, TopicPartition, timeout)
            for tp, ts in read.items():
                found[(tp.topic, tp.partition), wanted[tp]] = ts
    finally:
        probe.close()
    return found


Request = tuple[PipelineSpec, Mapping[str, str]]


def measure_lag(pipeline: PipelineSpec, secret: Mapping[str, str], timeout: float) -> LagReport:
    """Blocking: run it in a thread. One pipeline's :func:`measure_lags`."""
    (report,) = measure_lags([(pipeline, secret)], timeout)
    if isinstance(report, KafkaAccessError):
        raise report
    return report


def measure_lags(
    requests: Sequence[Request], timeout: float, deadline: float | None = None
) -> list[LagReport | KafkaAccessError]:
    """The lag of many pipelines, in one round per Kafka cluster (pipelines whose clients have
    the same configuration): one metadata request, one list_offsets per offset kind for every
    partition of them all, the groups' committed offsets requested together, one probe for
    the timestamps. Blocking: run it in a thread. Each pipeline's own error is its result.

    Each cluster is measured in its own thread, all at once, and the round waits for them at
    most ``deadline`` seconds (default ``timeout``): a tenant's slow or silent brokers give
    that tenant's pipelines an error naming the deadline and cannot hold the other tenants'
    lag back for longer. A cluster whose measurement is still running from an earlier round
    (its thread cannot be stopped, only its calls time out) is not measured again until it
    ends, so a silent broker costs one thread, not one a round."""
    limit = timeout if deadline is None else deadline
    out: list[LagReport | KafkaAccessError] = [KafkaAccessError("not measured")] * len(requests)
    clusters: dict[str, tuple[dict[str, Any], list[int]]] = {}
    for i, (pipeline, secret) in enumerate(requests):
        try:
            conf = admin_config(pipeline, secret, timeout)
        except KafkaAccessError as exc:
            out[i] = exc
            continue
        clusters.setdefault(_config_key(conf), (conf, []))[1].append(i)
    running: dict[str, concurrent.futures.Future[list[LagReport | KafkaAccessError]]] = {}
    for key, (conf, members) in clusters.items():
        future = _start_cluster(key, conf, [requests[i][0] for i in members], timeout)
        if future is None:
            error = KafkaAccessError(
                f"lag not measured: the brokers {conf.get('bootstrap.servers')!r} have not "
                "answered an earlier lag round yet (its requests time out on their own)"
            )
            for i in members:
                out[i] = error
            continue
        running[key] = future
    concurrent.futures.wait(list(running.values()), timeout=limit)
    for key, future in running.items():
        members = clusters[key][1]
        if not future.done():
            error = KafkaAccessError(
                f"lag round gave up after {limit:g}s: the brokers "
                f"{clusters[key][0].get('bootstrap.servers')!r} did not answer in time "
                "(other pipelines' lag is measured all the same)"
            )
            for i in members:
                out[i] = error
            continue
        try:
            reports = future.result()
        except Exception as exc:  # a bug in one cluster's round is that cluster's error
            reports = [KafkaAccessError(f"lag not measured: {exc!r}")] * len(members)
        for i, report in zip(members, reports, strict=True):
            out[i] = report
    return out


#: Clusters (by client configuration) whose measurement is running in a thread of its own.
_IN_FLIGHT: set[str] = set()
_IN_FLIGHT_LOCK = threading.Lock()


def _start_cluster(
    key: str, conf: Mapping[str, Any], pipelines: Sequence[PipelineSpec], timeout: float
) -> concurrent.futures.Future[list[LagReport | KafkaAccessError]] | None:
    """``_measure_cluster`` in a daemon thread of its own; None while one runs for ``key``."""
    with _IN_FLIGHT_LOCK:
        if key in _IN_FLIGHT:
            return None
        _IN_FLIGHT.add(key)
    future: concurrent.futures.Future[list[LagReport | KafkaAccessError]] = (
        concurrent.futures.Future()
    )

    def run() -> None:
        reports: list[LagReport | KafkaAccessError] = []
        error: Exception | None = None
        try:
            reports = _measure_cluster(conf, pipelines, timeout)
        except Exception as exc:
            error = exc
        # Out of flight before the result is seen: the next round may measure it again.
        with _IN_FLIGHT_LOCK:
            _IN_FLIGHT.discard(key)
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(reports)

    threading.Thread(target=run, name="offtake-lag-round", daemon=True).start()
    return future


def _measure_cluster(
    conf: Mapping[str, Any], pipelines: Sequence[PipelineSpec], timeout: float
) -> list[LagReport | KafkaAccessError]:
    admin = admin_client(conf)
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        # Named: the status says which brokers failed, as the round's deadline error does
        # (a tenant's silent broker fails here first when its socket timeout is the shorter).
        error = KafkaAccessError(
            f"cannot read topic metadata from {conf.get('bootstrap.servers')!r}: {exc.args[0]}"
        )
        return [error] * len(pipelines)
    partitions: list[list[TP] | KafkaAccessError] = []
    for pipeline in pipelines:
        try:
            partitions.append(_partitions(pipeline.source.topics, existing))
        except KafkaAccessError as exc:
            partitions.append(exc)
    every = sorted({tp for tps in partitions if isinstance(tps, list) for tp in tps})
    end = _offsets(admin, every, LATEST, timeout)
    start = _offsets(admin, every, EARLIEST, timeout)
    groups: dict[str, set[TP]] = {}
    for pipeline, tps in zip(pipelines, partitions, strict=True):
        if isinstance(tps, list) and not pipeline.source.is_share_group:
            groups.setdefault(pipeline.source.group_id, set()).update(tps)
    committed = _committed(admin, groups, timeout)

    behind: list[tuple[dict[TP, int], dict[TP, int]] | LagReport | KafkaAccessError] = []
    for pipeline, tps in zip(pipelines, partitions, strict=True):
        if isinstance(tps, KafkaAccessError):
            behind.append(tps)
            continue
        if pipeline.source.is_share_group:
            # Queue mode: a share group has no committed offsets (its start offsets need
            # DescribeShareGroupOffsets, which confluent-kafka's AdminClient does not have), so
            # no lag rather than a wrong one; the workers export the age of records when acquired.
            behind.append(LagReport(lag=None, lag_seconds=None, partitions=len(tps)))
            continue
        group = committed[pipeline.source.group_id]
        failed = next(
            (
                x
                for x in [group, *(end[tp] for tp in tps), *(start[tp] for tp in tps)]
                if isinstance(x, KafkaAccessError)
            ),
            None,
        )
        if failed is not None:
            behind.append(failed)
            continue
        assert not isinstance(group, KafkaAccessError)
        ends = {tp: int(cast(int, end[tp])) for tp in tps}
        starts = {tp: int(cast(int, start[tp])) for tp in tps}
        lag = compute_lag(ends, group, starts, pipeline.source.start_from)
        positions = {tp: group.get(tp, starts.get(tp, 0)) for tp, n in lag.items() if n > 0}
        behind.append((lag, positions))
    wanted = [(tp, offset) for b in behind if isinstance(b, tuple) for tp, offset in b[1].items()]
    stamps = oldest_timestamps(conf, wanted, timeout=min(timeout, 5.0))
    now_ms = int(time.time() * 1000)
    out: list[LagReport | KafkaAccessError] = []
    for b in behind:
        if isinstance(b, (KafkaAccessError, LagReport)):
            out.append(b)
            continue
        lag, positions = b
        found = {tp: stamps[tp, off] for tp, off in positions.items() if (tp, off) in stamps}
        out.append(
            LagReport(
                lag=sum(lag.values()),
                lag_seconds=round(lag_seconds(found, now_ms), 3),
                partitions=len(lag),
            )
        )
    return out


def _partitions(topics: Sequence[str], existing: Mapping[str, Any]) -> list[TP]:
    """Every partition of the source topics; a pattern (``^...``) stands for every existing
    topic it matches, as the workers' subscription does (none yet: no partitions)."""
    out: list[TP] = []
    for topic in matching_topics(topics, existing):
        info = existing.get(topic)
        if info is None or info.error is not None or not info.partitions:
            err = info.error if info is not None else "not found"
            raise KafkaAccessError(f"topic {topic!r}: {err}")
        out += [(topic, p) for p in sorted(info.partitions)]
    return out


def _settled(
    futures: Mapping[Any, Any], timeout: float, what: Callable[[Any], str]
) -> dict[Any, Any]:
    """Each future's result, or the KafkaAccessError naming ``what(key)``; one deadline for all."""
    concurrent.futures.wait(list(futures.values()), timeout=timeout)
    out: dict[Any, Any] = {}
    for key, future in futures.items():
        try:
            out[key] = await_result(future, 0, what(key))
        except KafkaAccessError as exc:
            out[key] = exc
    return out


def _offsets(
    admin: AdminClient, tps: list[TP], spec: OffsetSpec, timeout: float
) -> dict[TP, int | KafkaAccessError]:
    if not tps:
        return {}
    futures = admin.list_offsets(
        {TopicPartition(t, p): spec for t, p in tps}, request_timeout=timeout
    )
    results = _settled(futures, timeout, lambda tp: f"offsets of {tp.topic}[{tp.partition}]")
    return {
        (tp.topic, tp.partition): r if isinstance(r, KafkaAccessError) else r.offset
        for tp, r in results.items()
    }


def _committed(
    admin: AdminClient, groups: Mapping[str, set[TP]], timeout: float
) -> dict[str, dict[TP, int] | KafkaAccessError]:
    """Each group's committed offsets: one request per group (the admin API takes one group a
    request), all sent before any answer is awaited."""
    futures = {}
    for group, tps in groups.items():
        request = ConsumerGroupTopicPartitions(
            group, [TopicPartition(t, p) for t, p in sorted(tps)]
        )
        futures[group] = admin.list_consumer_group_offsets([request], request_timeout=timeout)[
            group
        ]
    results = _settled(futures, timeout, lambda g: f"committed offsets of group {g!r}")
    return {
        group: r
        if isinstance(r, KafkaAccessError)
        else {
            (tp.topic, tp.partition): tp.offset
            for tp in r.topic_partitions
            if tp.error is None and tp.offset >= 0
        }
        for group, r in results.items()
    }
