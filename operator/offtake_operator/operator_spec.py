"""The spec fields only the operator reads: rewind, redrive, autoscaling, serviceMonitor (the
worker ignores them).

The API server has already checked these against the CRD; this module checks them again
because an object can reach the operator without that check (an older CRD, a test server),
and a bad one must become a Degraded condition naming the field, never a crash. The defaults
are the CRD's, filled in from it as the API server fills them (the worker's package copy).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from offtake.contract import (
    ConfigError,
    RedriveRequest,
    crd_node,
    dlq_topic_of,
    parse_redrive,
    with_defaults,
)

RewindTarget = Literal["earliest", "latest", "timestamp"]


@dataclass(frozen=True)
class Rewind:
    id: str
    to: RewindTarget
    timestamp: datetime.datetime | None = None

    @property
    def timestamp_ms(self) -> int | None:
        return None if self.timestamp is None else int(self.timestamp.timestamp() * 1000)


#: Lag per replica without targetLagSeconds or targetLagPerReplica. Not a CRD default: the
#: CRD's rule that the two exclude each other could not tell a default from a written value.
TARGET_LAG_PER_REPLICA = 1000


@dataclass(frozen=True, kw_only=True)
class Autoscaling:
    enabled: bool
    min_replicas: int
    max_replicas: int
    target_lag_per_replica: int
    #: When set, scale on the age of the oldest uncommitted record instead of messages.
    target_lag_seconds: int | None = None
    #: How long a lower replica count must be recommended before the autoscaler scales down,
    #: so that a drained backlog does not make the group rebalance back and forth.
    scale_down_stabilization_seconds: int
    #: Prometheus that KEDA's Prometheus scaler asks for the lag in seconds.
    prometheus_address: str | None = None

    #: Queue mode with targetLagPerReplica: scale on the share group's backlog (the records
    #: past the acquisition frontier, offtake_operator.queue_autoscaling), not on lag.
    on_backlog: bool = False

    @property
    def on_seconds(self) -> bool:
        return self.target_lag_seconds is not None

    @property
    def asks_prometheus(self) -> bool:
        """Whether the signal is Prometheus's (KEDA's Kafka scaler knows only group lag)."""
        return self.on_seconds or self.on_backlog


@dataclass(frozen=True, kw_only=True)
class Slo:
    """spec.slo: the objectives the operator turns into the pipeline's PrometheusRule."""

    max_lag_seconds: int | None = None
    #: Budget of records that end in an error outcome (dlq, skipped, failed) per record done.
    max_error_ratio: float | None = None
    max_time_since_last_commit_seconds: int | None = None
    #: How long a breach must last before its alert fires (each rule's ``for``).
    alert_after_seconds: int


@dataclass(frozen=True)
class OperatorSpec:
    rewind: Rewind | None
    autoscaling: Autoscaling
    slo: Slo | None = None
    #: spec.redrive, read by the worker's own parser (offtake.config.redrive).
    redrive: RedriveRequest | None = None
    #: Extra labels of the pipeline's ServiceMonitor (spec.serviceMonitor.labels), e.g. the
    #: ``release`` label kube-prometheus-stack selects ServiceMonitors by.
    service_monitor_labels: dict[str, str] = field(default_factory=dict)


def parse_operator_spec(spec: Mapping[str, Any]) -> OperatorSpec:
    """Read spec.rewind and spec.autoscaling; raise ConfigError naming the field."""
    return OperatorSpec(
        rewind=_rewind(spec.get("rewind")),
        autoscaling=_autoscaling(
            spec.get("autoscaling"), (spec.get("source") or {}).get("groupType") == "share"
        ),
        service_monitor_labels=_service_monitor_labels(spec.get("serviceMonitor")),
        redrive=parse_redrive(spec.get("redrive"), dlq_topic_of(spec)),
        slo=_slo(spec.get("slo")),
    )


def _slo(raw: Any) -> Slo | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError("spec.slo", "expected a mapping")
    raw = _defaulted(raw, "slo")

    def seconds(key: str, least: int = 1) -> int | None:
        value = raw.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(
                f"spec.slo.{key}", f"expected whole seconds >= {least}, got {value!r}"
            )
        return value

    ratio = raw.get("maxErrorRatio")
    if ratio is not None and (
        isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 1e-6 <= ratio <= 0.5
    ):
        raise ConfigError(
            "spec.slo.maxErrorRatio", f"expected a fraction from 0.000001 to 0.5, got {ratio!r}"
        )
    after = seconds("alertAfterSeconds", least=0)
    assert after is not None  # the CRD's default
    slo = Slo(
        max_lag_seconds=seconds("maxLagSeconds"),
        max_error_ratio=None if ratio is None else float(ratio),
        max_time_since_last_commit_seconds=seconds("maxTimeSinceLastCommitSeconds"),
        alert_after_seconds=after,
    )
    if (slo.max_lag_seconds, slo.max_error_ratio, slo.max_time_since_last_commit_seconds) == (
        None,
        None,
        None,
    ):
        raise ConfigError(
            "spec.slo",
            "set at least one of maxLagSeconds, maxErrorRatio, maxTimeSinceLastCommitSeconds",
        )
    return slo


def _service_monitor_labels(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError("spec.serviceMonitor", "expected a mapping with labels")
    labels = raw.get("labels") or {}
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise ConfigError("spec.serviceMonitor.labels", "expected a map of strings to strings")
    return dict(labels)


def _rewind(raw: Any) -> Rewind | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError("spec.rewind", "expected a mapping with to and id")
    rid = raw.get("id")
    if not isinstance(rid, str) or not rid:
        raise ConfigError("spec.rewind.id", "is required: a new id requests a new rewind")
    to = raw.get("to")
    if to not in ("earliest", "latest", "timestamp"):
        raise ConfigError(
            "spec.rewind.to", f"expected one of earliest, latest, timestamp, got {to!r}"
        )
    stamp = None
    if to == "timestamp":
        text = raw.get("timestamp")
        if not isinstance(text, str):
            raise ConfigError("spec.rewind.timestamp", "is required when rewind.to is timestamp")
        try:
            stamp = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError("spec.rewind.timestamp", f"expected RFC 3339, got {text!r}") from None
        if stamp.tzinfo is None:
            raise ConfigError("spec.rewind.timestamp", f"needs a time zone (e.g. Z), got {text!r}")
    return Rewind(id=rid, to=to, timestamp=stamp)


def _defaulted(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """spec.<key> with the CRD's defaults, a null field counting as unset."""
    given = {k: v for k, v in raw.items() if v is not None}
    out: Mapping[str, Any] = with_defaults(given, crd_node("spec", key))
    return out


def _autoscaling(raw: Any, queue_mode: bool = False) -> Autoscaling:
    """``queue_mode``: source.groupType share, which scales on targetLagSeconds or, with
    targetLagPerReplica, on its backlog."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError("spec.autoscaling", "expected a mapping")
    raw = _defaulted(raw, "autoscaling")
    enabled = raw["enabled"]
    if not isinstance(enabled, bool):
        raise ConfigError("spec.autoscaling.enabled", f"expected true or false, got {enabled!r}")

    def count(key: str, least: int = 1, default: int | None = None) -> int:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(
                f"spec.autoscaling.{key}", f"expected an integer >= {least}, got {value!r}"
            )
        return value

    if "targetLagSeconds" in raw and "targetLagPerReplica" in raw:
        raise ConfigError(
            "spec.autoscaling.targetLagSeconds",
            "set either targetLagSeconds or targetLagPerReplica, not both",
        )
    address = raw.get("prometheusAddress")
    if address is not None and (not isinstance(address, str) or "://" not in address):
        raise ConfigError(
            "spec.autoscaling.prometheusAddress",
            f"expected a URL such as http://prometheus:9090, got {address!r}",
        )
    out = Autoscaling(
        enabled=enabled,
        # 0: KEDA scales to zero; an HPA keeps one (see render.render_hpa).
        min_replicas=count("minReplicas", least=0),
        max_replicas=count("maxReplicas"),
        target_lag_per_replica=count("targetLagPerReplica", default=TARGET_LAG_PER_REPLICA),
        target_lag_seconds=count("targetLagSeconds") if "targetLagSeconds" in raw else None,
        scale_down_stabilization_seconds=count("scaleDownStabilizationSeconds", least=0),
        prometheus_address=address,
        # Queue mode: targetLagPerReplica is the backlog one worker carries (no lag to count).
        on_backlog=queue_mode and "targetLagPerReplica" in raw,
    )
    if queue_mode and out.enabled and not out.asks_prometheus:
        # A default messages target would watch a lag no one measures: a share group commits
        # no offsets, and KEDA's Kafka scaler reads consumer groups only.
        raise ConfigError(
            "spec.autoscaling.targetLagSeconds",
            "or targetLagPerReplica is required in queue mode (source.groupType share): a "
            "share group commits no offsets, so there is no lag in messages to default to; "
            "scale on the age of records when acquired (targetLagSeconds) or on the backlog "
            "past the acquisition frontier, per worker (targetLagPerReplica)",
        )
    if out.min_replicas > out.max_replicas:
        raise ConfigError(
            "spec.autoscaling.minReplicas",
            f"must not exceed maxReplicas ({out.min_replicas} > {out.max_replicas})",
        )
    return out
