"""The operator's own Prometheus series: how its reconciles go.

``offtake_operator_reconciles_total{result}`` counts passes by how they ended (``ok``;
``invalid``: the spec or its Secret cannot run; ``rejected``: the API server refused a child;
``error``: an exception, retried by kopf), ``offtake_operator_reconcile_duration_seconds`` times
them. Served on ``OFFTAKE_METRICS_PORT`` (``offtake-operator`` starts the server; 0 turns it
off); the chart's alert ``OfftakeOperatorReconcileErrors`` watches the error rate.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)
RESULTS = ("ok", "invalid", "rejected", "error")

RECONCILES = Counter(
    "offtake_operator_reconciles",
    "Reconcile passes of ConsumerPipelines, by how they ended.",
    ["result"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "offtake_operator_reconcile_duration_seconds",
    "Wall time of one reconcile pass (API reads and writes included).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)
for _result in RESULTS:  # every series from the start: rate() needs a zero to begin from
    RECONCILES.labels(_result)


def serve(port: int) -> None:
    """Serve /metrics on ``port`` in a background thread (0: do not serve)."""
    if port:
        start_http_server(port, registry=REGISTRY)
