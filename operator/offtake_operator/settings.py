"""The operator's own settings, from environment variables (set by the Helm chart)."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import OperatorError

# The Dockerfile's targets: `worker` (no JRE, no pyspark) and `worker-spark` (both).
DEFAULT_WORKER_IMAGE = "ghcr.io/offtake/offtake-worker:0.1.0"
DEFAULT_WORKER_SPARK_IMAGE = "ghcr.io/offtake/offtake-worker-spark:0.1.0"
LAG_SOURCES = ("kafka", "off")

# Resources of a worker container whose pipeline sets no spec.resources (the chart's
# workerDefaults; these are its defaults too). A shared cluster expects requests (the scheduler
# places pods by them, quotas count them) and a memory limit (a leaking worker is OOM-killed
# alone instead of starving its node). No cpu limit: throttling a consumer raises its lag
# without protecting anyone that the cpu request does not already protect.
DEFAULT_WORKER_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "100m", "memory": "256Mi"},
    "limits": {"memory": "1Gi"},
}
# A pipeline with a Spark sink runs the worker-spark image; in local mode Spark's JVM sits in
# the worker's container, with spark.driver.memory's default heap of 1g on top of Python.
DEFAULT_WORKER_SPARK_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "500m", "memory": "1536Mi"},
    "limits": {"memory": "3Gi"},
}
_RESOURCE_SECTIONS = ("requests", "limits")


class SettingsError(OperatorError, ValueError):
    """An OFFTAKE_* environment variable has a value the operator cannot use."""


@dataclass(frozen=True)
class OperatorConfig:
    #: The image of the worker containers (OFFTAKE_WORKER_IMAGE); spec.image overrides it.
    worker_image: str = DEFAULT_WORKER_IMAGE
    #: The image of pipelines with a Spark sink, which need pyspark and a JRE
    #: (OFFTAKE_WORKER_SPARK_IMAGE); spec.image overrides it too.
    worker_spark_image: str = DEFAULT_WORKER_SPARK_IMAGE
    #: imagePullPolicy of the worker containers (OFFTAKE_WORKER_IMAGE_PULL_POLICY), "" = default.
    worker_image_pull_policy: str = ""
    #: Seconds between level-based reconciles of each pipeline (OFFTAKE_RESYNC_SECONDS).
    resync_seconds: float = 30.0
    #: Seconds between lag measurements of each pipeline (OFFTAKE_LAG_INTERVAL_SECONDS).
    lag_interval_seconds: float = 15.0
    #: Where lag comes from (OFFTAKE_LAG_SOURCE): "kafka" (the admin API) or "off".
    lag_source: str = "kafka"
    #: Seconds between checks while a rewind waits for an empty group
    #: (OFFTAKE_REWIND_POLL_SECONDS).
    rewind_poll_seconds: float = 2.0
    #: Namespaces to serve (OFFTAKE_NAMESPACES, comma-separated); empty means all namespaces.
    namespaces: tuple[str, ...] = ()
    #: kopf peering object name (OFFTAKE_PEERING); empty runs standalone (one replica only).
    peering: str = ""
    #: Seconds after which a silent peer counts as gone and a standby replica takes over
    #: (OFFTAKE_PEERING_LIFETIME_SECONDS; kopf renews its record well before that).
    peering_lifetime_seconds: int = 60
    #: Reconcile passes and lag status writes at once, over all pipelines
    #: (OFFTAKE_API_CONCURRENCY). A thousand pipelines created at once would otherwise each
    #: hold API requests in the client's connection pool until they time out; the rest wait
    #: their turn (and coalesce). 32: about as many requests in flight as the client's 20
    #: connections serve without a long wait (a pass has one to four at a time).
    api_concurrency: int = 32
    #: Timeout in seconds of each Kafka admin call (OFFTAKE_KAFKA_TIMEOUT_SECONDS).
    kafka_timeout_seconds: float = 10.0
    #: Labels of every pipeline's ServiceMonitor (OFFTAKE_SERVICE_MONITOR_LABELS, a JSON
    #: object), e.g. {"release": "kube-prometheus-stack"}; spec.serviceMonitor.labels adds to it.
    service_monitor_labels: dict[str, str] = field(default_factory=dict)
    #: Port of the operator's own /metrics (OFFTAKE_METRICS_PORT); 0 serves none.
    metrics_port: int = 0
    #: Port of the sidecar-injection admission webhook (OFFTAKE_WEBHOOK_PORT); 0 serves none.
    webhook_port: int = 0
    #: Address the webhook listens on (OFFTAKE_WEBHOOK_ADDRESS).
    webhook_address: str = "0.0.0.0"
    #: The webhook's TLS certificate and key, PEM files (OFFTAKE_WEBHOOK_CERT_FILE,
    #: OFFTAKE_WEBHOOK_KEY_FILE): the API server only calls webhooks over HTTPS.
    webhook_cert_file: str = ""
    webhook_key_file: str = ""
    #: Resources of the worker containers (the Deployment's, the injected worker, the redrive
    #: Job's) of pipelines without spec.resources (OFFTAKE_WORKER_RESOURCES, a JSON
    #: ResourceRequirements; {} sets none).
    worker_resources: dict[str, Any] = field(
        default_factory=lambda: copy.deepcopy(DEFAULT_WORKER_RESOURCES)
    )
    #: The same for pipelines with a Spark sink (OFFTAKE_WORKER_SPARK_RESOURCES).
    worker_spark_resources: dict[str, Any] = field(
        default_factory=lambda: copy.deepcopy(DEFAULT_WORKER_SPARK_RESOURCES)
    )
    #: A CA (PEM file, OFFTAKE_WEBHOOK_CLIENT_CA_FILE) the callers of the webhook must present
    #: a client certificate from: the API server's, when the cluster gives it one for webhooks
    #: (AdmissionConfiguration kubeConfigFile). The chart sets it by default
    #: (injection.requireClientCert). Empty: no client certificate is asked for.
    webhook_client_ca_file: str = ""
    #: Render a NetworkPolicy for each pipeline's worker pods (OFFTAKE_WORKER_NETWORK_POLICY,
    #: true or false; the chart's networkPolicy.enabled): see :mod:`.worker_network_policy`.
    worker_network_policy: bool = False
    #: Who may reach the workers' metrics port (OFFTAKE_WORKER_METRICS_FROM, a JSON list of
    #: NetworkPolicy peers; the chart's networkPolicy.metricsFrom); empty admits any peer.
    worker_metrics_from: tuple[dict[str, Any], ...] = ()
    #: Whether a pipeline's spec.source.groupId must start with "<namespace>."
    #: (OFFTAKE_CONFINE_GROUP_IDS, true or false; see :mod:`.group_ids`).
    confine_group_ids: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        env = os.environ if env is None else env
        lag_source = env.get("OFFTAKE_LAG_SOURCE", "kafka")
        if lag_source not in LAG_SOURCES:
            raise SettingsError(
                f"OFFTAKE_LAG_SOURCE: expected one of {', '.join(LAG_SOURCES)}, got {lag_source!r}"
            )
        policy = env.get("OFFTAKE_WORKER_IMAGE_PULL_POLICY", "")
        if policy not in ("", "Always", "IfNotPresent", "Never"):
            raise SettingsError(
                "OFFTAKE_WORKER_IMAGE_PULL_POLICY: expected Always, IfNotPresent or Never, "
                f"got {policy!r}"
            )
        worker_image = env.get("OFFTAKE_WORKER_IMAGE", "")
        # Only OFFTAKE_WORKER_IMAGE set: one image of the user's own for every pipeline.
        spark_image = env.get("OFFTAKE_WORKER_SPARK_IMAGE", "") or (
            worker_image or DEFAULT_WORKER_SPARK_IMAGE
        )
        return cls(
            worker_image=worker_image or DEFAULT_WORKER_IMAGE,
            worker_spark_image=spark_image,
            worker_image_pull_policy=policy,
            resync_seconds=_seconds(env, "OFFTAKE_RESYNC_SECONDS", cls.resync_seconds),
            lag_interval_seconds=_seconds(
                env, "OFFTAKE_LAG_INTERVAL_SECONDS", cls.lag_interval_seconds
            ),
            lag_source=lag_source,
            rewind_poll_seconds=_seconds(
                env, "OFFTAKE_REWIND_POLL_SECONDS", cls.rewind_poll_seconds
            ),
            namespaces=tuple(
                n.strip() for n in env.get("OFFTAKE_NAMESPACES", "").split(",") if n.strip()
            ),
            peering=env.get("OFFTAKE_PEERING", "").strip(),
            peering_lifetime_seconds=int(
                _seconds(env, "OFFTAKE_PEERING_LIFETIME_SECONDS", cls.peering_lifetime_seconds)
            ),
            api_concurrency=_count(env, "OFFTAKE_API_CONCURRENCY", cls.api_concurrency),
            kafka_timeout_seconds=_seconds(
                env, "OFFTAKE_KAFKA_TIMEOUT_SECONDS", cls.kafka_timeout_seconds
            ),
            service_monitor_labels=_labels(env, "OFFTAKE_SERVICE_MONITOR_LABELS"),
            metrics_port=_port(env, "OFFTAKE_METRICS_PORT"),
            worker_resources=_resources(env, "OFFTAKE_WORKER_RESOURCES", DEFAULT_WORKER_RESOURCES),
            worker_spark_resources=_resources(
                env, "OFFTAKE_WORKER_SPARK_RESOURCES", DEFAULT_WORKER_SPARK_RESOURCES
            ),
            confine_group_ids=_flag(env, "OFFTAKE_CONFINE_GROUP_IDS", cls.confine_group_ids),
            **_webhook(env),
            **_worker_network_policy(env),
        )


def _worker_network_policy(env: Mapping[str, str]) -> dict[str, Any]:
    key = "OFFTAKE_WORKER_NETWORK_POLICY"
    enabled = env.get(key, "").strip().lower() or "false"
    if enabled not in ("true", "false"):
        raise SettingsError(f"{key}: expected true or false, got {env[key]!r}")
    key = "OFFTAKE_WORKER_METRICS_FROM"
    raw = env.get(key, "").strip() or "[]"
    try:
        peers = json.loads(raw)
    except ValueError:
        raise SettingsError(
            f"{key}: expected a JSON list of NetworkPolicy peers, got {raw!r}"
        ) from None
    if not isinstance(peers, list) or not all(isinstance(p, dict) and p for p in peers):
        raise SettingsError(
            f"{key}: expected a JSON list of NetworkPolicy peers (objects such as "
            f'{{"namespaceSelector": {{...}}}}), got {raw!r}'
        )
    return {"worker_network_policy": enabled == "true", "worker_metrics_from": tuple(peers)}


def _webhook(env: Mapping[str, str]) -> dict[str, Any]:
    port = _port(env, "OFFTAKE_WEBHOOK_PORT")
    cert = env.get("OFFTAKE_WEBHOOK_CERT_FILE", "").strip()
    key = env.get("OFFTAKE_WEBHOOK_KEY_FILE", "").strip()
    if port and not (cert and key):
        raise SettingsError(
            "OFFTAKE_WEBHOOK_PORT is set: OFFTAKE_WEBHOOK_CERT_FILE and OFFTAKE_WEBHOOK_KEY_FILE "
            "must name the webhook's TLS certificate and key"
        )
    return {
        "webhook_port": port,
        "webhook_address": env.get("OFFTAKE_WEBHOOK_ADDRESS", "").strip() or "0.0.0.0",
        "webhook_cert_file": cert,
        "webhook_key_file": key,
        "webhook_client_ca_file": env.get("OFFTAKE_WEBHOOK_CLIENT_CA_FILE", "").strip(),
    }


def _seconds(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(key, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{key}: expected a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise SettingsError(f"{key}: expected a positive number of seconds, got {raw!r}")
    return value


def _flag(env: Mapping[str, str], key: str, default: bool) -> bool:
    raw = env.get(key, "").strip().lower()
    if not raw:
        return default
    if raw not in ("true", "false"):
        raise SettingsError(f"{key}: expected true or false, got {raw!r}")
    return raw == "true"


def _count(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise SettingsError(f"{key}: expected a whole number of at least 1, got {raw!r}")
    return int(raw)


def _labels(env: Mapping[str, str], key: str) -> dict[str, str]:
    raw = env.get(key, "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise SettingsError(f"{key}: expected a JSON object of labels, got {raw!r}") from None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise SettingsError(f"{key}: expected a JSON object of string labels, got {raw!r}")
    return value


def _port(env: Mapping[str, str], key: str) -> int:
    raw = env.get(key, "").strip() or "0"
    if not raw.isdigit() or int(raw) > 65535:
        raise SettingsError(f"{key}: expected a port number (0 for none), got {raw!r}")
    return int(raw)


def _resources(env: Mapping[str, str], key: str, default: Mapping[str, Any]) -> dict[str, Any]:
    """A container's ResourceRequirements as JSON: {"requests": {...}, "limits": {...}}."""
    raw = env.get(key, "").strip()
    if not raw:
        return copy.deepcopy(dict(default))
    try:
        value = json.loads(raw)
    except ValueError:
        raise SettingsError(
            f"{key}: expected a JSON object like "
            f'{{"requests": {{"cpu": "100m"}}, "limits": {{"memory": "1Gi"}}}}, got {raw!r}'
        ) from None
    if not isinstance(value, dict):
        raise SettingsError(f"{key}: expected a JSON object of requests and limits, got {raw!r}")
    for section, amounts in value.items():
        if section not in _RESOURCE_SECTIONS:
            raise SettingsError(
                f"{key}: unknown key {section!r} (expected {' or '.join(_RESOURCE_SECTIONS)})"
            )
        if not isinstance(amounts, dict) or not all(
            isinstance(name, str) and isinstance(amount, str | int) and not isinstance(amount, bool)
            for name, amount in amounts.items()
        ):
            raise SettingsError(
                f"{key}: {section} must map resource names to quantities "
                f'(e.g. {{"memory": "1Gi"}}), got {json.dumps(amounts)}'
            )
    # Empty sections say nothing: leave them out, so that {} renders no resources at all.
    return {section: amounts for section, amounts in value.items() if amounts}
