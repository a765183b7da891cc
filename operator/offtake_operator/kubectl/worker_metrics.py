"""The workers' own Prometheus metrics, read through the API server's pod proxy.

``/api/v1/namespaces/N/pods/P:PORT/proxy/metrics`` is what reaches a worker's metrics port
from a laptop (the pod network is rarely routed there, and no Prometheus is needed). The port
and path are the pod's ``prometheus.io/port`` and ``prometheus.io/path`` annotations (what the
operator renders from ``spec.metrics.port`` and what scrapers read), else the worker
container's port named ``metrics``. A pod that cannot be read is named with the reason; the
rest of ``status`` does not depend on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .. import names
from .cluster import JSON, Cluster
from .errors import PluginError

LAG = "offtake_consumer_lag_messages"
LAG_SECONDS = "offtake_consumer_lag_seconds"
TREND = "offtake_consumer_lag_trend_messages_per_second"
PROCESSED = "offtake_messages_processed_total"
#: Queue mode: each worker's estimate of the records past the share group's acquisition frontier.
BACKLOG = "offtake_share_backlog_messages"
#: processor.concurrency above 1: each worker's calls running now, records waiting behind a busy
#: key (or partition), and the age of its oldest call still running.
CALLS_IN_FLIGHT = "offtake_processor_calls_in_flight"
RECORDS_WAITING = "offtake_processor_records_waiting"
OLDEST_CALL = "offtake_processor_oldest_call_seconds"
CALLS = (CALLS_IN_FLIGHT, RECORDS_WAITING, OLDEST_CALL)
#: The outcomes spec.slo.maxErrorRatio counts against its budget (as slo_rules.py does).
ERROR_OUTCOMES = frozenset({"dlq", "skipped", "failed"})


@dataclass
class Scrape:
    """What the workers' /metrics said: per partition (by its owner pod), and per outcome."""

    partitions: dict[tuple[str, int], JSON] = field(default_factory=dict)
    outcomes: dict[str, float] = field(default_factory=dict)
    #: Queue mode, per partition: the least backlog any worker reports (the one furthest
    #: ahead knows the group's frontier best).
    backlog: dict[tuple[str, int], float] = field(default_factory=dict)
    #: Per pod, its CALLS gauges (name -> value).
    calls: dict[str, dict[str, float]] = field(default_factory=dict)
    read: list[str] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)


def metrics_address(pod: Mapping[str, Any]) -> tuple[int, str] | None:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    path = str(annotations.get("prometheus.io/path") or "/metrics")
    port = annotations.get("prometheus.io/port")
    if port is None:
        containers = (pod.get("spec") or {}).get("containers") or []
        port = next(
            (
                p.get("containerPort")
                for c in containers
                for p in c.get("ports") or []
                if p.get("name") == names.METRICS_PORT_NAME
            ),
            None,
        )
    try:
        return (int(port), path) if port is not None else None
    except ValueError:
        return None


def pod_metrics(cluster: Cluster, pod: Mapping[str, Any]) -> str:
    """The text of one worker's /metrics; a :class:`PluginError` says why it cannot be read."""
    name = str(pod["metadata"]["name"])
    if not (pod.get("status") or {}).get("podIP"):
        raise PluginError("no pod IP yet")
    address = metrics_address(pod)
    if address is None:
        raise PluginError("no metrics port (prometheus.io/port or a port named metrics)")
    return cluster.pod_proxy_get(name, *address)


def scrape(cluster: Cluster, pods: Iterable[Mapping[str, Any]]) -> Scrape:
    out = Scrape()
    for pod in pods:
        name = str(pod["metadata"]["name"])
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue  # a leaving worker's partitions are someone else's now
        try:
            _add(out, name, pod_metrics(cluster, pod))
        except PluginError as exc:
            out.unreadable[name] = str(exc)
            continue
        except ValueError as exc:
            out.unreadable[name] = f"its /metrics does not parse: {exc}"
            continue
        out.read.append(name)
    return out


def _add(out: Scrape, pod: str, text: str) -> None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name in (LAG, LAG_SECONDS, TREND):
                key = (labels["topic"], int(labels["partition"]))
                row = out.partitions.setdefault(key, {"pod": pod})
                row[sample.name] = sample.value
            elif sample.name == BACKLOG:
                key = (labels["topic"], int(labels["partition"]))
                out.backlog[key] = min(sample.value, out.backlog.get(key, sample.value))
            elif sample.name in CALLS:
                out.calls.setdefault(pod, {})[sample.name] = sample.value
            elif sample.name == PROCESSED:
                outcome = labels["outcome"]
                out.outcomes[outcome] = out.outcomes.get(outcome, 0.0) + sample.value
