"""Client configuration of the memory broker: librdkafka properties parsed into values.

Owns :class:`ConsumerSettings` and the parsing of boolean and ``*.ms`` properties, with
librdkafka's defaults. Immutable values built once per client, no locking.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import KafkaError

from .assignors import RebalanceProtocol, parse_strategy
from .errors import raise_kafka

OffsetReset = Literal["earliest", "latest", "error"]


def conf_bool(config: Mapping[str, Any], key: str, default: bool) -> bool:
    value = config.get(key, default)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise_kafka(
        KafkaError._INVALID_ARG,
        f"configuration property {key!r}: expected true or false, got {value!r}",
    )


def conf_ms(config: Mapping[str, Any], key: str, default: int) -> float:
    """A librdkafka ``*.ms`` property, in seconds."""
    value = config.get(key, default)
    try:
        return int(value) / 1000.0
    except (TypeError, ValueError):
        raise_kafka(
            KafkaError._INVALID_ARG,
            f"configuration property {key!r}: expected milliseconds, got {value!r}",
        )


def _offset_reset(config: Mapping[str, Any]) -> OffsetReset:
    reset = str(config.get("auto.offset.reset", "latest")).lower()
    if reset in ("earliest", "smallest", "beginning"):
        return "earliest"
    if reset in ("latest", "largest", "end"):
        return "latest"
    if reset == "error":
        return "error"
    raise_kafka(
        KafkaError._INVALID_ARG,
        f"auto.offset.reset: expected earliest, latest or error, got {reset!r}",
    )


@dataclass(frozen=True)
class ConsumerSettings:
    """What a consumer's configuration means to the memory broker."""

    group_id: str
    client_id: str
    reset: OffsetReset
    protocol: RebalanceProtocol
    strategies: list[str]
    auto_commit: bool
    auto_commit_interval: float
    auto_store: bool
    partition_eof: bool
    max_poll_interval: float
    instance_id: str | None  # group.instance.id: static membership (KIP-345)
    session_timeout: float

    @classmethod
    def parse(cls, config: Mapping[str, Any]) -> ConsumerSettings:
        group = config.get("group.id")
        if not group:
            raise_kafka(
                KafkaError._INVALID_ARG, "Failed to create consumer: group.id must be configured"
            )
        reset = _offset_reset(config)
        protocol, strategies = parse_strategy(
            config.get("partition.assignment.strategy", "range,roundrobin")
        )
        return cls(
            group_id=str(group),
            client_id=str(config.get("client.id", "rdkafka")),
            reset=reset,
            protocol=protocol,
            strategies=strategies,
            auto_commit=conf_bool(config, "enable.auto.commit", True),
            auto_commit_interval=conf_ms(config, "auto.commit.interval.ms", 5000),
            auto_store=conf_bool(config, "enable.auto.offset.store", True),
            partition_eof=conf_bool(config, "enable.partition.eof", False),
            max_poll_interval=conf_ms(config, "max.poll.interval.ms", 300_000),
            instance_id=(
                str(config["group.instance.id"]) if config.get("group.instance.id") else None
            ),
            session_timeout=conf_ms(config, "session.timeout.ms", 45_000),
        )
