"""The Grafana dashboard's structure; its queries are evaluated in test_prometheus_scrape."""

from __future__ import annotations

import json
import re
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from offtake.metrics import Metrics
from offtake.records import TopicPartition

from .conftest import ROOT, rendered_slo_groups

DASHBOARD = ROOT / "dashboards" / "offtake.json"
REQUIRED_PANELS = {
    "Consumed by topic",
    "Processed by outcome",
    "Lag (messages) by partition",
    "Lag (seconds) by partition",
    "Backpressure (fraction of time)",
    "In-flight messages",
    "Calls in flight",
    "Records waiting behind a busy key",
    "Oldest call",
    "Commit rate",
    "Commit latency",
    "Rebalances",
    "Dead-lettered",
    "Errors by stage",
    "Sink latency",
    "Spark jobs",
}


def load() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel."""
    return [
        (p["title"], t["expr"])
        for p in dashboard["panels"]
        if p["type"] != "row"
        for t in p.get("targets", [])
    ]


def exported_names() -> set[str]:
    m = Metrics()
    m.init_topics(["t"])
    m.set_lag(TopicPartition("t", 0), 1, 1.0)  # lag series exist for assigned partitions only
    text = generate_latest(m.registry).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_variables_namespace_and_pipeline_from_prometheus() -> None:
    variables = {v["name"]: v for v in load()["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    assert "namespace" in variables["namespace"]["definition"]
    assert "$namespace" in variables["pipeline"]["definition"]


def test_required_panels_exist_and_every_query_is_scoped_to_the_pipeline() -> None:
    d = load()
    titles = {p["title"] for p in d["panels"]}
    assert titles >= REQUIRED_PANELS, REQUIRED_PANELS - titles
    queries = panel_queries(d)
    assert len(queries) >= 25
    for title, expr in queries:
        assert 'namespace="$namespace"' in expr and 'pipeline="$pipeline"' in expr, title


def test_every_query_uses_series_the_worker_exports_or_the_slo_rules_record() -> None:
    groups = rendered_slo_groups()["groups"]
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    names = exported_names() | {"up"} | recorded
    for title, expr in panel_queries(load()):
        used = set(re.findall(r"\b((?:offtake[_:]|up\b)[a-z_:0-9]*)\s*\{", expr))
        assert used and used <= names, (title, used - names)


def test_panel_ids_are_unique_and_panels_do_not_overlap() -> None:
    panels = load()["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        xs, ys = range(g["x"], g["x"] + g["w"]), range(g["y"], g["y"] + g["h"])
        box = {(x, y) for x in xs for y in ys}
        assert not box & cells, p["title"]
        cells |= box
