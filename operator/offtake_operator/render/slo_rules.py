"""spec.slo -> the pipeline's PrometheusRule: recording rules for its service-level indicators
and one alert per objective.

- lag: the age of the oldest uncommitted record (``offtake_consumer_lag_seconds``, worst
  partition over all workers) above ``maxLagSeconds``;
- errors: records that end in an error outcome (``dlq``, ``skipped``, ``failed``) per record
  done (``retried`` records are not done yet), against the budget ``maxErrorRatio``, as the
  multi-window burn-rate alerts of Google's SRE workbook: a fast burn (14.4x the budget over
  both 1 h and 5 m, 2 % of a 30-day budget in an hour) pages, a slow one (6x over 6 h and
  30 m) warns. Both windows must agree so that a short spike does not page and a recovered
  pipeline stops paging within the short window;
- commits: there is lag and no worker committed for ``maxTimeSinceLastCommitSeconds``.

Every series is selected by the pipeline's ``namespace`` and ``pipeline`` labels (the scrape's
target labels, docs/metrics.md); each rule carries them, so alerts route per pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from offtake.contract import LAG_MESSAGES_METRIC, LAG_SECONDS_METRIC

from .. import names
from ..operator_spec import Slo
from .metadata import JSON, child_metadata, meta

#: (severity, burn-rate factor, long window, short window) of the error-budget alerts.
BURN_RATES = (("critical", 14.4, "1h", "5m"), ("warning", 6.0, "6h", "30m"))
_ERROR_OUTCOMES = "dlq|skipped|failed"
OBJECTIVE_LAG = "offtake:slo_objective_lag_seconds"
OBJECTIVE_ERROR_RATIO = "offtake:slo_objective_error_ratio"


def error_ratio_record(window: str) -> str:
    return f"offtake:slo_error_ratio:rate{window}"


def _duration(seconds: int) -> str:
    return f"{seconds}s"


def _selector(namespace: str, name: str) -> str:
    return f'namespace="{namespace}", pipeline="{name}"'


class _Rules:
    """What every rule of one pipeline shares: its selector, labels, name and alert wait."""

    def __init__(self, body: Mapping[str, Any], slo: Slo) -> None:
        self.name, self.namespace = meta(body)
        self.sel = _selector(self.namespace, self.name)
        self.labels = {"namespace": self.namespace, "pipeline": self.name}
        self.where = f"{self.namespace}/{self.name}"
        self.wait = _duration(slo.alert_after_seconds)


def _lag_rules(r: _Rules, limit: int) -> list[JSON]:
    """spec.slo.maxLagSeconds: its objective, the worst lag and the alert."""
    name, sel, labels, where, wait = r.name, r.sel, r.labels, r.where, r.wait
    rules: list[JSON] = []
    # The objective as a series too: dashboards draw it beside the lag (dashboards/).
    rules.append({"record": OBJECTIVE_LAG, "expr": f"vector({limit})", "labels": dict(labels)})
    rules.append(
        {
            "record": "offtake:slo_lag_seconds:max",
            "expr": f"max by (namespace, pipeline) ({LAG_SECONDS_METRIC}{{{sel}}})",
        }
    )
    rules.append(
        {
            "alert": "OfftakeSLOLagSeconds",
            "expr": f"offtake:slo_lag_seconds:max{{{sel}}} > {limit}",
            "for": wait,
            "labels": {**labels, "severity": "warning", "slo": "lag"},
            "annotations": {
                "summary": f"{where} is {{{{ $value | humanizeDuration }}}} behind "
                f"(objective: {limit} s)",
                "description": f"The oldest uncommitted record of pipeline {name} has been "
                f"older than its objective spec.slo.maxLagSeconds={limit} for {wait}.",
            },
        }
    )
    return rules


def _error_rules(r: _Rules, budget: float) -> list[JSON]:
    """spec.slo.maxErrorRatio: its objective, the ratio per window and the burn-rate alerts."""
    name, sel, labels, where, wait = r.name, r.sel, r.labels, r.where, r.wait
    rules: list[JSON] = []
    rules.append(
        {"record": OBJECTIVE_ERROR_RATIO, "expr": f"vector({budget})", "labels": dict(labels)}
    )
    # 30d: the budget's period, for "error budget left" on the dashboard.
    windows = sorted({w for _, _, long, short in BURN_RATES for w in (long, short)} | {"30d"})
    for window in windows:
        bad = (
            f"sum by (namespace, pipeline) (rate(offtake_messages_processed_total{{{sel}, "
            f'outcome=~"{_ERROR_OUTCOMES}"}}[{window}]))'
        )
        done = (
            f"sum by (namespace, pipeline) (rate(offtake_messages_processed_total{{{sel}, "
            f'outcome!="retried"}}[{window}]))'
        )
        rules.append({"record": error_ratio_record(window), "expr": f"{bad} / {done}"})
    for severity, factor, long, short in BURN_RATES:
        rules.append(
            {
                "alert": "OfftakeSLOErrorBudgetBurn",
                "expr": (
                    f"{error_ratio_record(long)}{{{sel}}} > ({factor} * {budget})\n"
                    f"and {error_ratio_record(short)}{{{sel}}} > ({factor} * {budget})"
                ),
                "for": wait,
                "labels": {**labels, "severity": severity, "slo": "errors"},
                "annotations": {
                    "summary": f"{where} burns its error budget {factor}x too fast",
                    "description": f"Over {long} and {short}, more than {factor} x "
                    f"spec.slo.maxErrorRatio={budget} of pipeline {name}'s records ended "
                    "in the DLQ, were skipped or failed.",
                },
            }
        )
    return rules


def _commit_rules(r: _Rules, limit: int) -> list[JSON]:
    """spec.slo.maxTimeSinceLastCommitSeconds: lag and no commit."""
    name, sel, labels, where, wait = r.name, r.sel, r.labels, r.where, r.wait
    rules: list[JSON] = []
    rules.append(
        {
            "alert": "OfftakeSLONoCommit",
            "expr": (
                f"(sum by (namespace, pipeline) ({LAG_MESSAGES_METRIC}{{{sel}}}) > 0)\n"
                "unless on (namespace, pipeline)\n"
                f"(sum by (namespace, pipeline) (increase(offtake_commits_total{{{sel}, "
                f'result="success"}}[{limit}s])) > 0)'
            ),
            "for": wait,
            "labels": {**labels, "severity": "critical", "slo": "commits"},
            "annotations": {
                "summary": f"{where} has lag and committed nothing for {limit} s",
                "description": f"No worker of pipeline {name} committed an offset within "
                f"spec.slo.maxTimeSinceLastCommitSeconds={limit} while records wait.",
            },
        }
    )
    return rules


def render_prometheus_rule(
    body: Mapping[str, Any], slo: Slo, extra_labels: Mapping[str, str] | None = None
) -> JSON:
    """The PrometheusRule named after the pipeline, owned by it (deleted with it).
    ``extra_labels``: what a Prometheus selects rules by (kube-prometheus-stack: ``release``)."""
    r = _Rules(body, slo)
    rules: list[JSON] = []
    if slo.max_lag_seconds is not None:
        rules += _lag_rules(r, slo.max_lag_seconds)
    if slo.max_error_ratio is not None:
        rules += _error_rules(r, slo.max_error_ratio)
    if slo.max_time_since_last_commit_seconds is not None:
        rules += _commit_rules(r, slo.max_time_since_last_commit_seconds)
    name, namespace = r.name, r.namespace
    metadata = child_metadata(body, names.slo_rule_name(name), "slo")
    metadata["labels"] = {**(extra_labels or {}), **metadata["labels"]}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": metadata,
        "spec": {"groups": [{"name": f"offtake-slo.{namespace}.{name}", "rules": rules}]},
    }
