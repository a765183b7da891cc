"""Generate dashboards/offtake.json from this description, and the Helm chart's copies.

    python dashboards/generate.py          # rewrite offtake.json and the chart's copies
    python dashboards/generate.py --check  # exit 1 if any is out of date

The chart gets copies of offtake.json and alerts.yaml in helm/offtake/dashboards/ because
Helm's .Files can only read files inside the chart (and symlinks out of it are not packaged).

A Grafana dashboard is a large JSON document where one panel's query sits among dozens of
layout keys; writing the panels as data here keeps the queries reviewable, and a test keeps the
committed JSON, the chart's copy and this file in step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "dashboards" / "offtake.json"
ALERTS = ROOT / "dashboards" / "alerts.yaml"
CHART_DIR = ROOT / "helm" / "offtake" / "dashboards"

# Every worker series carries namespace and pipeline from the scrape's target labels.
SEL = 'namespace="$namespace", pipeline="$pipeline"'
DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"


Query = dict[str, str]
#: (panel title, type, unit, description, queries)
Panel = tuple[str, str, str, str, list[Query]]


def q(expr: str, legend: str = "") -> Query:
    return {"expr": expr, "legendFormat": legend}


def per(label: str, metric: str, over: str = "rate") -> Query:
    """A counter's ``over`` (rate or increase) summed by ``label``, one series per value."""
    return q(f"sum by ({label}) ({over}({metric}{{{SEL}}}[{RI}]))", f"{{{{{label}}}}}")


def per_partition(gauge: str) -> Query:
    return q(f"max by (topic, partition) ({gauge}{{{SEL}}})", "{{topic}}[{{partition}}]")


def per_worker(gauge: str) -> Query:
    return q(f"sum by (instance) ({gauge}{{{SEL}}})", "{{instance}}")


def quantiles(series: str, ps: tuple[float, ...] = (0.5, 0.99)) -> list[Query]:
    return [
        q(
            f"histogram_quantile({p}, sum by (le) (rate({series}_bucket{{{SEL}}}[{RI}])))",
            f"p{int(p * 100)}",
        )
        for p in ps
    ]


def stat(title: str, unit: str, description: str, *queries: Query) -> Panel:
    return (title, "stat", unit, description, list(queries))


def graph(title: str, unit: str, description: str, *queries: Query) -> Panel:
    return (title, "timeseries", unit, description, list(queries))


ROWS: list[tuple[str, list[Panel]]] = [
    (
        "Overview",
        [
            stat(
                "Workers up",
                "short",
                "Scrape targets of this pipeline that answer.",
                q(f'sum(up{{job="offtake", {SEL}}})'),
            ),
            stat(
                "Consumed",
                "ops",
                "Records consumed per second, all topics.",
                q(f"sum(rate(offtake_messages_consumed_total{{{SEL}}}[{RI}]))"),
            ),
            stat(
                "Lag",
                "short",
                "Log-end minus committed offset, summed over partitions.",
                q(f"sum(max by (topic, partition) (offtake_consumer_lag_messages{{{SEL}}}))"),
            ),
            stat(
                "Oldest uncommitted record",
                "s",
                "Age of the oldest record not yet committed, worst partition.",
                q(f"max(offtake_consumer_lag_seconds{{{SEL}}})"),
            ),
            stat(
                "Assigned partitions",
                "short",
                "Partitions assigned across workers.",
                q(f"sum(offtake_assigned_partitions{{{SEL}}})"),
            ),
            stat(
                "Version",
                "short",
                "Offtake versions running (count of workers).",
                q(f"count by (version) (offtake_build_info{{{SEL}}})", "{{version}}"),
            ),
        ],
    ),
    (
        "Throughput",
        [
            graph(
                "Consumed by topic",
                "ops",
                "Records consumed from Kafka per second.",
                per("topic", "offtake_messages_consumed_total"),
            ),
            graph(
                "Processed by outcome",
                "ops",
                "Records done per second: delivered, dropped by the processor, or handled by the "
                "error policy (dlq, skipped, failed).",
                per("outcome", "offtake_messages_processed_total"),
            ),
        ],
    ),
    (
        # Series recorded by the pipeline's PrometheusRule from spec.slo (docs/operator.md,
        # "SLOs"); empty for a pipeline without SLOs.
        "SLO",
        [
            graph(
                "Lag seconds against the objective",
                "s",
                "Age of the oldest uncommitted record (worst partition)"
                " and spec.slo.maxLagSeconds.",
                q(f"max(offtake_consumer_lag_seconds{{{SEL}}})", "lag"),
                q(f"max(offtake:slo_objective_lag_seconds{{{SEL}}})", "objective"),
            ),
            stat(
                "Error budget left (30 days)",
                "percentunit",
                "1 - (error ratio over 30 days / spec.slo.maxErrorRatio); error: a record that "
                "ended in the DLQ, was skipped or failed. Below 0: the budget is spent.",
                q(
                    f"1 - max(offtake:slo_error_ratio:rate30d{{{SEL}}})"
                    f" / max(offtake:slo_objective_error_ratio{{{SEL}}})"
                ),
            ),
            graph(
                "Workers against partitions",
                "short",
                "Workers running (an autoscaler moves them) and the partitions they share: "
                "workers beyond the partition count sit idle.",
                q(f"count(offtake_build_info{{{SEL}}})", "workers"),
                q(f"sum(offtake_assigned_partitions{{{SEL}}})", "partitions"),
            ),
        ],
    ),
    (
        "Lag",
        [
            graph(
                "Lag (messages) by partition",
                "short",
                "Log-end offset minus committed offset of each assigned partition.",
                per_partition("offtake_consumer_lag_messages"),
            ),
            graph(
                "Lag (seconds) by partition",
                "s",
                "Age of the oldest record not yet committed, from record timestamps.",
                per_partition("offtake_consumer_lag_seconds"),
            ),
        ],
    ),
    (
        "Flow control",
        [
            graph(
                "Backpressure (fraction of time)",
                "percentunit",
                "Fraction of time each worker had its partitions paused because in-flight work "
                "reached its bound.",
                per("instance", "offtake_backpressure_seconds_total"),
            ),
            graph(
                "Time in state",
                "percentunit",
                "Average fraction of time the workers spend busy, idle or in backpressure.",
                q(
                    f"avg by (state) (rate(offtake_state_seconds_total{{{SEL}}}[{RI}]))",
                    "{{state}}",
                ),
            ),
            graph(
                "In-flight messages",
                "short",
                "Records consumed and not yet committed, per worker.",
                per_worker("offtake_inflight_messages"),
            ),
            graph(
                "In-flight bytes",
                "bytes",
                "Bytes of records consumed and not yet committed, per worker.",
                per_worker("offtake_inflight_bytes"),
            ),
            graph(
                "Paused and assigned partitions",
                "short",
                "Partitions paused for backpressure, against partitions assigned.",
                q(f"sum(offtake_paused_partitions{{{SEL}}})", "paused"),
                q(f"sum(offtake_assigned_partitions{{{SEL}}})", "assigned"),
            ),
        ],
    ),
    (
        # processor.concurrency above 1 (docs/worker.md "Waiting on other services"); at
        # concurrency 1 the three read 0.
        "Calls (processor.concurrency)",
        [
            graph(
                "Calls in flight",
                "short",
                "Calls of the processor running now, per worker: at most processor.concurrency.",
                per_worker("offtake_processor_calls_in_flight"),
            ),
            graph(
                "Records waiting behind a busy key",
                "short",
                "Records handed out that wait for their key (or partition, processor.order) to "
                "be free, per worker: a hot key shows here.",
                per_worker("offtake_processor_records_waiting"),
            ),
            graph(
                "Oldest call",
                "s",
                "Age of the oldest call still running, per worker (0 when none runs): a service "
                "that stopped answering shows here before the lag does.",
                q(
                    f"max by (instance) (offtake_processor_oldest_call_seconds{{{SEL}}})",
                    "{{instance}}",
                ),
            ),
        ],
    ),
    (
        "Commits and group",
        [
            graph(
                "Commit rate",
                "ops",
                "Offset commits per second, by result.",
                per("result", "offtake_commits_total"),
            ),
            graph(
                "Commit latency",
                "s",
                "Time from issuing a commit until the broker acknowledged it.",
                *quantiles("offtake_commit_duration_seconds"),
            ),
            graph(
                "Rebalances",
                "short",
                "Rebalance events per interval: partitions assigned, revoked, or lost.",
                per("kind", "offtake_rebalances_total", over="increase"),
            ),
        ],
    ),
    (
        "Errors",
        [
            graph(
                "Dead-lettered",
                "ops",
                "Records routed to the dead-letter topic per second, by source topic.",
                per("topic", "offtake_dlq_messages_total"),
            ),
            graph(
                "Errors by stage",
                "ops",
                "Errors per second by stage (each attempt counted), and retries.",
                per("stage", "offtake_errors_total"),
                q(f"sum(rate(offtake_retries_total{{{SEL}}}[{RI}]))", "retries"),
            ),
        ],
    ),
    (
        "Latency",
        [
            graph(
                "Processing latency",
                "s",
                "Time to process one batch of records.",
                *quantiles("offtake_processing_duration_seconds"),
            ),
            graph(
                "Sink latency",
                "s",
                "Time from submitting a record to the sink until the sink confirmed it.",
                *quantiles("offtake_sink_duration_seconds"),
            ),
        ],
    ),
    (
        "Spark jobs",
        [
            graph(
                "Spark jobs",
                "short",
                "Spark batch jobs per interval, by result.",
                per("result", "offtake_spark_jobs_total", over="increase"),
            ),
            graph(
                "Spark job duration",
                "s",
                "Duration of Spark batch jobs.",
                *quantiles("offtake_spark_job_duration_seconds"),
            ),
            graph(
                "Records per Spark batch",
                "short",
                "Median records per batch.",
                *quantiles("offtake_spark_batch_records", ps=(0.5,)),
            ),
            stat(
                "Since last successful Spark batch",
                "s",
                "Seconds since the most recent successful Spark batch of any worker.",
                q(f"time() - max(offtake_spark_last_success_timestamp_seconds{{{SEL}}} > 0)"),
            ),
        ],
    ),
]


def _variables() -> list[dict[str, Any]]:
    def query_var(name: str, query: str) -> dict[str, Any]:
        return {
            "name": name,
            "label": name.capitalize(),
            "type": "query",
            "datasource": DS,
            "query": {"query": query, "refId": f"{name}-values"},
            "definition": query,
            "refresh": 2,  # on time range change: pipelines come and go
            "sort": 1,
            "multi": False,
            "includeAll": False,
            "current": {},
            "options": [],
            "hide": 0,
        }

    return [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "options": [],
            "refresh": 1,
        },
        query_var("namespace", "label_values(offtake_build_info, namespace)"),
        query_var("pipeline", 'label_values(offtake_build_info{namespace="$namespace"}, pipeline)'),
    ]


def _panel(
    pid: int,
    title: str,
    kind: str,
    unit: str,
    desc: str,
    queries: list[Query],
    pos: dict[str, int],
) -> dict[str, Any]:
    panel: dict[str, Any] = {
        "id": pid,
        "title": title,
        "description": desc,
        "type": kind,
        "datasource": DS,
        "gridPos": pos,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {
                "datasource": DS,
                "refId": chr(ord("A") + i),
                "expr": t["expr"],
                "legendFormat": t["legendFormat"] or "__auto",
                "range": True,
            }
            for i, t in enumerate(queries)
        ],
    }
    if kind == "stat":
        panel["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
        }
    else:
        panel["fieldConfig"]["defaults"]["custom"] = {
            "drawStyle": "line",
            "fillOpacity": 10,
            "lineWidth": 1,
            "showPoints": "never",
        }
        panel["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    return panel


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for row_title, row_panels in ROWS:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y = pid + 1, y + 1
        x = 0
        for title, kind, unit, desc, queries in row_panels:
            w, h = (4, 4) if kind == "stat" else (12, 8)
            if x + w > 24:
                x, y = 0, y + h
            panels.append(
                _panel(pid, title, kind, unit, desc, queries, {"h": h, "w": w, "x": x, "y": y})
            )
            pid, x = pid + 1, x + w
        y += 8
    return {
        "uid": "offtake-pipeline",
        "title": "Offtake pipeline",
        "description": "One Offtake ConsumerPipeline: throughput, lag, flow control, commits, "
        "errors, latency and Spark jobs. See docs/metrics.md.",
        "tags": ["offtake", "kafka"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {"list": _variables()},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def expected_outputs() -> list[tuple[Path, str]]:
    """(path, content) of every generated file."""
    text, alerts = render(), ALERTS.read_text()
    return [
        (DASHBOARD, text),
        (CHART_DIR / "offtake.json", text),
        (CHART_DIR / "alerts.yaml", alerts),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if a file is out of date")
    args = parser.parse_args(argv)
    outputs = dict(expected_outputs())
    stale = [p for p, t in outputs.items() if not p.exists() or p.read_text() != t]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is out of date: run python dashboards/generate.py")
        return 1 if stale else 0
    for p, t in outputs.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
