"""KEDA's ScaledObject and TriggerAuthentication, and when KEDA is the one to use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from offtake.contract import PipelineSpec

from .. import names, queue_autoscaling
from ..operator_spec import Autoscaling
from .metadata import JSON, child_metadata, meta
from .scaling import behavior, lag_seconds_query, replica_bounds, scale_target

#: librdkafka property (a file of the mounted Kafka Secret) -> KEDA's Kafka scaler parameter.
KEDA_AUTH_PARAMETERS = {
    "sasl.username": "username",
    "sasl.password": "password",
    "ssl.ca.pem": "ca",
    "ssl.certificate.pem": "cert",
    "ssl.key.pem": "key",
    "ssl.key.password": "keyPassword",
}


_KEDA_SASL = {
    "PLAIN": "plaintext",
    "SCRAM-SHA-256": "scram_sha256",
    "SCRAM-SHA-512": "scram_sha512",
}


def keda_security(pipeline: PipelineSpec) -> dict[str, str]:
    """KEDA's ``sasl`` and ``tls`` trigger settings from the pipeline's (non-secret) config."""
    conf = pipeline.kafka.config
    out: dict[str, str] = {}
    mechanism = (conf.get("sasl.mechanism") or conf.get("sasl.mechanisms") or "").upper()
    if mechanism in _KEDA_SASL:
        out["sasl"] = _KEDA_SASL[mechanism]
    if conf.get("security.protocol", "").upper() in ("SSL", "SASL_SSL"):
        out["tls"] = "enable"
    return out


def render_trigger_authentication(
    body: Mapping[str, Any], kafka_mounts: Sequence[tuple[str, Mapping[str, str]]]
) -> JSON | None:
    """A KEDA TriggerAuthentication reading the pipeline's own Kafka Secret, so KEDA reaches a
    SASL/TLS cluster with the workers' credentials; None when the Secret has none KEDA takes."""
    name, _ = meta(body)
    refs = [
        {"parameter": KEDA_AUTH_PARAMETERS[prop], "name": secret_name, "key": key}
        for secret_name, files in kafka_mounts
        for key, prop in sorted(files.items())
        if prop in KEDA_AUTH_PARAMETERS
    ]
    if not refs:
        return None
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "TriggerAuthentication",
        "metadata": child_metadata(body, names.autoscaler_name(name), "autoscaler"),
        "spec": {"secretTargetRef": refs},
    }


def render_scaled_object(
    body: Mapping[str, Any],
    pipeline: PipelineSpec,
    autoscaling: Autoscaling,
    partitions: int | None,
    *,
    authenticated: bool = False,
) -> JSON:
    """A KEDA ScaledObject: KEDA's own Kafka scaler on lag in messages (no metrics adapter
    needed; ``authenticated``: its trigger uses the TriggerAuthentication of the same name),
    or its Prometheus scaler on lag in seconds."""
    name, _ = meta(body)
    low, high = replica_bounds(autoscaling, partitions)
    if autoscaling.on_backlog:  # queue mode: the share group's backlog
        scaler = queue_autoscaling.keda_trigger(*meta(body), autoscaling)
    elif autoscaling.on_seconds:
        scaler = _prometheus_trigger(body, autoscaling)
    else:
        scaler = _kafka_trigger(body, pipeline, autoscaling, authenticated=authenticated)
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": child_metadata(body, names.autoscaler_name(name), "autoscaler"),
        "spec": {
            "scaleTargetRef": scale_target(body),
            "minReplicaCount": low,
            "maxReplicaCount": high,
            "pollingInterval": 15,
            # cooldownPeriod is only the wait before scaling to zero; the HPA that KEDA
            # creates takes the stabilisation window for every other scale-down.
            "cooldownPeriod": autoscaling.scale_down_stabilization_seconds,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior(autoscaling)}},
            "triggers": [scaler],
        },
    }


def uses_scaled_object(autoscaling: Autoscaling, keda_served: bool) -> bool:
    """KEDA when installed, except for lag seconds or a queue-mode backlog without a
    Prometheus to ask: then the HPA on the external metric (served by a metrics adapter) is
    the one that can work."""
    return keda_served and (
        not autoscaling.asks_prometheus or autoscaling.prometheus_address is not None
    )


def _kafka_trigger(
    body: Mapping[str, Any],
    pipeline: PipelineSpec,
    autoscaling: Autoscaling,
    *,
    authenticated: bool,
) -> JSON:
    """KEDA's own Kafka scaler: it reads the group's lag in messages from the brokers."""
    name, _ = meta(body)
    trigger: dict[str, str] = {
        "bootstrapServers": pipeline.kafka.bootstrap_servers,
        "consumerGroup": pipeline.source.group_id,
        "lagThreshold": str(autoscaling.target_lag_per_replica),
        "offsetResetPolicy": pipeline.source.start_from,
    }
    # Without a topic KEDA's scaler counts every topic the group has offsets on: what a pattern
    # (or several topics) needs.
    if len(pipeline.source.topics) == 1 and not pipeline.source.patterns:
        trigger["topic"] = pipeline.source.topics[0]
    trigger.update(keda_security(pipeline))
    kafka_trigger: JSON = {"type": "kafka", "metadata": trigger}
    if authenticated:
        kafka_trigger["authenticationRef"] = {"name": names.autoscaler_name(name)}
    return kafka_trigger


def _prometheus_trigger(body: Mapping[str, Any], autoscaling: Autoscaling) -> JSON:
    """KEDA's Prometheus scaler on the lag in seconds (Kafka knows offsets, not record ages).
    metricType Value: the same proportional rule as the plain HPA's external metric."""
    return {
        "type": "prometheus",
        "metricType": "Value",
        "metadata": {
            "serverAddress": str(autoscaling.prometheus_address),
            "query": lag_seconds_query(body),
            "threshold": str(autoscaling.target_lag_seconds),
            # No worker scraped yet (or none running at zero): no lag, not an error.
            "ignoreNullValues": "true",
        },
    }
