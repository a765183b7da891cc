"""Autoscaling a queue-mode pipeline (source.groupType share) on its backlog.

A share group has no committed offsets, so no lag in messages; its backlog is the records past
the acquisition frontier, which each worker estimates (``offtake_share_backlog_messages``, see
docs/queue-mode.md). The worker furthest ahead knows the frontier best: the group's backlog is
the least any worker reports per partition, summed. Kafka's own scalers read consumer groups
only, so both autoscalers ask Prometheus: KEDA's Prometheus scaler with that query, or an HPA
on the external metric an adapter serves with it (docs/operator.md).

Replicas follow backlog / targetLagPerReplica (AverageValue: the backlog one worker is expected
to carry), as they follow lag in messages for a consumer group.
"""

from __future__ import annotations

from offtake.contract import SHARE_BACKLOG_METRIC

from .operator_spec import Autoscaling

JSON = dict[str, object]


def backlog_query(name: str, namespace: str) -> str:
    """PromQL for the pipeline's backlog: per partition the least any worker reports, summed."""
    series = f'{SHARE_BACKLOG_METRIC}{{namespace="{namespace}", pipeline="{name}"}}'
    return f"sum(min by (topic, partition) ({series}))"


def hpa_metric(name: str, autoscaling: Autoscaling) -> JSON:
    """The HPA's External metric: the adapter serves the query above for ``pipeline``."""
    return {
        "type": "External",
        "external": {
            "metric": {
                "name": SHARE_BACKLOG_METRIC,
                "selector": {"matchLabels": {"pipeline": name}},
            },
            "target": {
                "type": "AverageValue",
                "averageValue": str(autoscaling.target_lag_per_replica),
            },
        },
    }


def keda_trigger(name: str, namespace: str, autoscaling: Autoscaling) -> JSON:
    """KEDA's Prometheus scaler on the backlog, per replica."""
    return {
        "type": "prometheus",
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": str(autoscaling.prometheus_address),
            "query": backlog_query(name, namespace),
            "threshold": str(autoscaling.target_lag_per_replica),
            # No worker has acquired anything yet: no backlog known, not an error.
            "ignoreNullValues": "true",
        },
    }
