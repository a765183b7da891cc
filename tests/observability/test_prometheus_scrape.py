"""A real Prometheus scrapes a worker's /metrics every second; every dashboard query returns data.

The source of metrics is the ``metrics_target`` fixture (see conftest.py), so the same test
runs against a driven registry today and a real worker under load when that fixture is swapped.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import yaml

from offtake_testbed.prometheus import Prometheus

from .conftest import ALERTS, SCRAPE_JOB, STATIC_LABELS, MetricsTarget, rendered_slo_groups
from .test_dashboard import load, panel_queries

# Grafana's $__rate_interval is max(4 x scrape interval, $__interval + scrape interval); with
# 1 s scrapes 10 s holds about ten samples, enough for rate() and histogram_quantile().
GRAFANA_VARS = {
    "$__rate_interval": "10s",
    "$__interval": "2s",
    "$__range": "1m",
    "$namespace": STATIC_LABELS["namespace"],
    "$pipeline": STATIC_LABELS["pipeline"],
}


def substitute(expr: str) -> str:
    for var in sorted(GRAFANA_VARS, key=len, reverse=True):  # $__rate_interval before $__range
        expr = expr.replace(var, GRAFANA_VARS[var])
    assert "$" not in expr, f"unsubstituted variable in {expr!r}"
    return expr


def values(result: list[dict[str, Any]]) -> list[float]:
    out: list[float] = []
    for row in result:
        if "value" in row:
            out.append(float(row["value"][1]))
        else:
            out.extend(float(v) for _, v in row["values"])
    return out


def test_the_worker_is_scraped_with_the_pipeline_labels(prometheus: Prometheus) -> None:
    (target,) = [t for t in prometheus.targets() if t["labels"]["job"] == SCRAPE_JOB]
    assert target["health"] == "up", target["lastError"]
    assert target["labels"]["namespace"] == STATIC_LABELS["namespace"]
    assert target["labels"]["pipeline"] == STATIC_LABELS["pipeline"]
    (info,) = prometheus.wait_for("offtake_build_info")
    assert info["metric"]["pipeline"] == STATIC_LABELS["pipeline"]
    assert "exported_pipeline" not in info["metric"]


def test_dashboard_variables_find_the_pipeline(prometheus: Prometheus) -> None:
    namespaces = prometheus.api("label/namespace/values", **{"match[]": "offtake_build_info"})
    assert STATIC_LABELS["namespace"] in namespaces
    selector = f'offtake_build_info{{namespace="{STATIC_LABELS["namespace"]}"}}'
    assert prometheus.api("label/pipeline/values", **{"match[]": selector}) == [
        STATIC_LABELS["pipeline"]
    ]


def test_every_dashboard_query_returns_data(
    prometheus: Prometheus, metrics_target: MetricsTarget
) -> None:
    queries = [(title, substitute(expr)) for title, expr in panel_queries(load())]
    # Panels a source may leave empty (NaN or no series): a Kafka-sink worker runs no Spark jobs.
    optional: frozenset[str] = getattr(metrics_target, "optional_panels", frozenset())
    results: dict[int, list[dict[str, Any]]] = {}
    # Windows of 10 s need ten scrapes first: re-query what lacks data until all queries have
    # some, giving optional panels 30 s before settling for their being empty.
    start = time.monotonic()
    while True:
        for i, (_, expr) in enumerate(queries):
            if i not in results or not _has_data(results[i], False):
                results[i] = prometheus.query(expr)
        lacking = [i for i in results if not _has_data(results[i], False)]
        missing = [i for i in lacking if queries[i][0] not in optional]
        waited = time.monotonic() - start
        if not lacking or (not missing and waited > 30) or waited > 90:
            break
        time.sleep(1)
    report = [
        f"{'NO ' if i in missing else 'ok ' if _has_data(results[i], False) else 'opt'} "
        f"{title}: {expr} -> "
        f"{len(results[i])} series, e.g. {values(results[i])[:2]}"
        for i, (title, expr) in enumerate(queries)
    ]
    with_data = sum(_has_data(r, False) for r in results.values())
    print(
        f"\n{len(queries)} dashboard queries evaluated: {with_data} returned data, "
        f"{len(queries) - with_data - len(missing)} optional ones empty, {len(missing)} missing"
    )
    print("\n".join(report))
    assert not missing, "queries without data:\n" + "\n".join(report[i] for i in missing)


def _has_data(result: list[dict[str, Any]], optional: bool) -> bool:
    """At least one series, all values finite (or an optional panel)."""
    vs = values(result)
    return optional or (bool(vs) and all(math.isfinite(v) for v in vs))


def test_alert_rules_load_and_evaluate_cleanly_in_prometheus(prometheus: Prometheus) -> None:
    doc = yaml.safe_load(ALERTS.read_text())
    exprs = {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"]}
    for expr in exprs.values():
        prometheus.query(expr)  # raises with Prometheus' message on a bad expression
    deadline = time.monotonic() + 30
    while True:
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        if all(r.get("health") == "ok" for r in rules) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    # Besides alerts.yaml, the operator-rendered SLO rules of the test pipeline (conftest).
    slo = {
        r.get("alert") or r["record"] for g in rendered_slo_groups()["groups"] for r in g["rules"]
    }
    assert {r["name"] for r in rules} == set(exprs) | slo
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    # A healthy driven worker must not page anyone (nothing has been wrong long enough).
    firing = [a for a in prometheus.api("alerts")["alerts"] if a["state"] == "firing"]
    assert not firing, firing


@pytest.mark.parametrize(
    "series", ["offtake_consumer_lag_messages", "offtake_consumer_lag_seconds"]
)
def test_lag_series_are_per_assigned_partition(prometheus: Prometheus, series: str) -> None:
    result = prometheus.wait_for(series)
    partitions = {(r["metric"]["topic"], r["metric"]["partition"]) for r in result}
    assert partitions and all(p.isdigit() for _, p in partitions)
