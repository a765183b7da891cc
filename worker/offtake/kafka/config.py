"""librdkafka properties from the spec: the worker's consumer and producers, the operator's
admin client and probe.

Every client of a pipeline's cluster, in the worker or in the operator, starts from
:func:`client_config` (bootstrap servers, ``spec.kafka.config``, the Kafka Secret's
properties); the functions below add what each role needs. The engine's correctness depends
on a few consumer properties (manual commits, manual offset store), so those are forced.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from offtake import environment
from offtake.config import ConfigError
from offtake.config.client_properties import map_key, refused_reason, share_refusal
from offtake.config.spec import PipelineSpec
from offtake.logs import librdkafka_logger

log = logging.getLogger("offtake.kafka")

# The engine commits only offsets whose records reached the sink: auto commit would break that.
_FORCED_CONSUMER = {"enable.auto.commit": "false", "enable.auto.offset.store": "false"}
_CONSUMER_ONLY = (
    "partition.assignment.strategy",
    "session.timeout.ms",
    "max.poll.interval.ms",
    "heartbeat.interval.ms",
    "group.instance.id",
    "auto.offset.reset",
    "fetch.max.bytes",
    "max.partition.fetch.bytes",
    "fetch.wait.max.ms",
    "queued.max.messages.kbytes",
    "isolation.level",
    "group.protocol",
)
SECRET_DIR = "/etc/offtake/kafka-secret"


def secret_properties(directory: str | None = None) -> dict[str, str]:
    """librdkafka properties from a mounted Secret: one file per property (e.g. sasl.password)."""
    path = environment.directory(environment.KAFKA_SECRET_DIR_ENV, SECRET_DIR, directory)
    if not path.is_dir():
        return {}
    return {
        f.name: f.read_text().strip()
        for f in sorted(path.iterdir())
        if f.is_file() and not f.name.startswith(".")
    }


def client_config(
    spec: PipelineSpec, secret: Mapping[str, str], logger: logging.Logger
) -> dict[str, Any]:
    """What every client of the pipeline's cluster starts from, worker's or operator's.

    ``secret``: the Kafka Secret's properties (the worker reads them from its mounted files,
    :func:`secret_properties`; the operator from the API server). ``logger`` receives
    librdkafka's log lines instead of its raw syslog-style lines on stderr.
    """
    conf: dict[str, Any] = {"bootstrap.servers": spec.kafka.bootstrap_servers, "logger": logger}
    # The loader refused these in kafka.config already; the Secret's keys are checked here, so
    # that neither a hand-made Secret nor a mounted directory loads code or runs a command.
    for key, value in (*spec.kafka.config.items(), *secret.items()):
        reason = refused_reason(key, value)
        if reason is not None:
            where = "spec.kafka.config" if key in spec.kafka.config else "spec.kafka.secretRef"
            raise ConfigError(map_key(where, key), f"refused: {reason}")
    conf.update(spec.kafka.config)
    conf.update(secret)
    return conf


def _common(spec: PipelineSpec) -> dict[str, Any]:
    # librdkafka's log lines through the worker's JSON logging, repeats collapsed (offtake.logs).
    return client_config(spec, secret_properties(), librdkafka_logger())


# librdkafka logs these itself (its FAIL line names the broker and the cause) before it hands
# them to error_cb: logging them again from error_cb would write each failure twice.
_LOGGED_BY_LIBRDKAFKA = frozenset(
    {
        -195,  # _TRANSPORT: connection refused, reset, timed out
        -193,  # _RESOLVE: the host name does not resolve
        -181,  # _SSL
        -169,  # _AUTHENTICATION
        -187,  # _ALL_BROKERS_DOWN: follows the per-broker FAIL lines above
    }
)


def log_client_error(err: Any) -> None:
    """Log a non-fatal error from a client's error_cb, unless librdkafka logged it already."""
    code = err.code() if callable(getattr(err, "code", None)) else None
    if code in _LOGGED_BY_LIBRDKAFKA:
        return
    librdkafka_logger().warning("kafka: %s", err)


RETRY_FETCH_WAIT_MS = 100
# Once a partition's prefetch passes its bound, librdkafka postpones the next fetch by
# fetch.queue.backoff.ms: 1,000 by default, far longer than a busy worker takes to drain the
# queue, so the worker then sat in consume() with nothing to do (a quarter of its time, JSON
# enrich on the bench). A short backoff only checks the bound more often.
FETCH_QUEUE_BACKOFF_MS = 10


def prefetch_kbytes(spec: PipelineSpec) -> int:
    """The consumer's prefetch bound: a quarter of maxInFlightBytes, within 1 MiB..64 MiB."""
    return max(1024, min(65536, spec.limits.max_in_flight_bytes // 4 // 1024))


def consumer_config(spec: PipelineSpec, instance_id: str | None = None) -> dict[str, Any]:
    conf = {
        "group.id": spec.source.group_id,
        "auto.offset.reset": spec.source.start_from,
        "partition.assignment.strategy": "cooperative-sticky",
        "client.id": f"offtake-{spec.name}",
    }
    conf.update(_common(spec))
    for key, value in _FORCED_CONSUMER.items():
        if conf.get(key, value).lower() != value:
            log.warning(
                "spec.kafka.config.%s=%s is ignored: Offtake commits offsets itself "
                "once records reached the sink",
                key,
                conf[key],
            )
        conf[key] = value
    _apply_group_protocol(conf, spec.kafka.group_protocol)
    if spec.sink.kafka is not None and spec.sink.kafka.exactly_once:
        # Read only committed input: an upstream transaction that aborts must not reach the
        # output of ours (librdkafka's default too, but a kafka.config override must not win).
        if conf.get("isolation.level", "read_committed") != "read_committed":
            log.warning(
                "spec.kafka.config.isolation.level=%s is ignored: "
                "sink.kafka.delivery exactly-once reads committed records only",
                conf["isolation.level"],
            )
        conf["isolation.level"] = "read_committed"
    # librdkafka prefetches up to 64 MiB by default, on top of the in-flight work: size it from
    # the spec's byte bound, so that a pod's memory follows from its limits.
    conf.setdefault("queued.max.messages.kbytes", str(prefetch_kbytes(spec)))
    conf.setdefault("fetch.queue.backoff.ms", str(FETCH_QUEUE_BACKOFF_MS))
    if spec.errors.retry_topics:
        # A retry partition resumed when its record is due is fetched with the next fetch
        # request; with idle partitions the one under way waits up to fetch.wait.max.ms
        # (librdkafka: 500) for data first. Bound that lateness to a tenth of a second.
        conf.setdefault("fetch.wait.max.ms", str(RETRY_FETCH_WAIT_MS))
    if instance_id and "group.instance.id" not in conf:
        conf["group.instance.id"] = instance_id  # static membership: restarts do not rebalance
    return conf


def share_consumer_config(spec: PipelineSpec) -> dict[str, Any]:
    """The share consumer's settings (spec.source.groupType share): the group, the client's
    common settings, explicit acknowledgement. No offsets, assignment or session settings: a
    share group has none on the client (refused here, naming the property and what the group
    uses instead, rather than by librdkafka when the worker starts)."""
    conf = {"group.id": spec.source.group_id, "client.id": f"offtake-{spec.name}"}
    secret = secret_properties()
    check_share_properties(spec, secret)
    conf.update(client_config(spec, secret, librdkafka_logger()))
    conf["share.acknowledgement.mode"] = "explicit"
    return conf


def check_share_properties(spec: PipelineSpec, secret: Mapping[str, str]) -> None:
    """Refuse what a share consumer refuses or ignores (client_properties.SHARE_REFUSED and
    SHARE_IGNORED), naming the key and what the share group uses instead: in kafka.config (the
    loader refused those already; a spec built in code must not slip past it) and in the
    Kafka Secret the worker merges, which no loader sees."""
    for where, props in (
        ("spec.kafka.config", spec.kafka.config),
        ("spec.kafka.secretRef", secret),
    ):
        if refusal := share_refusal(where, props):
            raise ConfigError(*refusal)


# How long a producer holds records for a fuller batch (librdkafka: 5 ms). Each record's way
# to the output log waits up to this, and its commit behind it; under load batches fill while
# requests are in flight anyway. At 10,000 records/s (docs/bench.md, session 8) 2 ms keeps
# most of 1 ms's lower latency (own p99 5-6 ms, 1 ms: 4-5, 5 ms: 8-9) with half its produce
# requests (375/s against 714/s; 5 ms: 184/s). Throughput was the same with 1 and 5.
PRODUCER_LINGER_MS = 2


def producer_config(spec: PipelineSpec, overrides: dict[str, str] | None = None) -> dict[str, Any]:
    conf = {"linger.ms": str(PRODUCER_LINGER_MS), "client.id": f"offtake-{spec.name}"}
    conf.update({k: v for k, v in _common(spec).items() if k not in _CONSUMER_ONLY})
    # The loader refused these in sink.kafka.config already; a spec built in code must not slip
    # past it either.
    for key, value in (overrides or {}).items():
        reason = refused_reason(key, value)
        if reason is not None:
            raise ConfigError(map_key("spec.sink.kafka.config", key), f"refused: {reason}")
    conf.update(overrides or {})
    # Idempotence with acks=all: a delivery report means the record is durably in the log,
    # once, even when the producer retried; that is what "done" has to mean for commits.
    conf.update({"enable.idempotence": "true", "acks": "all"})
    return conf


# KIP-848: the broker assigns partitions and times sessions, so these classic-protocol client
# settings do not apply (librdkafka refuses or ignores them under group.protocol=consumer).
_CLASSIC_PROTOCOL_ONLY = (
    "partition.assignment.strategy",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "group.protocol.type",
)


def _apply_group_protocol(conf: dict[str, Any], protocol: str | None) -> None:
    """spec.kafka.groupProtocol: an assignor of the classic protocol, or KIP-848's consumer."""
    if protocol is None:
        return  # kafka.config's partition.assignment.strategy, else cooperative-sticky
    if protocol != "consumer":
        conf["partition.assignment.strategy"] = protocol
        return
    conf["group.protocol"] = "consumer"
    for key in _CLASSIC_PROTOCOL_ONLY:
        if key in conf and key != "partition.assignment.strategy":  # ours, not the user's
            log.warning(
                "spec.kafka.config.%s is ignored with groupProtocol consumer (KIP-848): "
                "the broker's group.consumer.* settings govern sessions and heartbeats",
                key,
            )
        conf.pop(key, None)


TRANSACTION_TIMEOUT_MS = "60000"


def transactional_producer_config(
    spec: PipelineSpec, overrides: dict[str, str] | None, instance: str
) -> dict[str, Any]:
    """The exactly-once sink's producer: idempotent, with a transactional.id per instance.

    KIP-447: the consumer's group metadata, sent with each transaction's offsets, fences a
    zombie after a rebalance, so the id need not follow partitions. It only has to be unique
    per live worker and, ideally, stable across a restart of the same worker, whose
    init_transactions() then aborts what a crashed predecessor left open at once instead of
    after transaction.timeout.ms (during which read_committed readers of those partitions
    wait).
    """
    conf = producer_config(spec, overrides)
    conf.setdefault("transactional.id", f"offtake-{spec.name}-{instance}")
    conf.setdefault("transaction.timeout.ms", TRANSACTION_TIMEOUT_MS)
    return conf


def probe_consumer_config(spec: PipelineSpec) -> dict[str, Any]:
    """The oldest-record probe's consumer: reads single records, joins no group's work.

    Its own group id, never committed to, never subscribed. It reads one record per peek:
    without the last two settings librdkafka would prefetch up to 100,000 records of the
    partition in the background, memory and fetches the worker never uses.
    """
    conf = consumer_config(spec)
    conf["group.id"] = f"{spec.source.group_id}.offtake-lag-probe"
    conf.pop("group.instance.id", None)
    conf.update({"queued.min.messages": 1, "fetch.message.max.bytes": 65536})
    return conf
