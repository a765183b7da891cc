"""The PrometheusRule the operator renders from spec.slo: valid for promtool, its alerts proven
by promtool's rule unit tests, and a real Prometheus evaluating it against a real worker that
lags: the lag alert goes pending, then firing, then resolves once the backlog drains."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from offtake_operator.operator_spec import parse_operator_spec
from offtake_operator.render.slo_rules import render_prometheus_rule
from offtake_testbed.kafka import KafkaBroker
from offtake_testbed.prometheus import Prometheus, promtool

from .conftest import SCRAPE_JOB, STATIC_LABELS
from .real_worker import RealWorker, produce


def pipeline(slo: dict[str, Any], name: str = "orders-enrich") -> dict[str, Any]:
    return {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": name, "namespace": "obs-test", "uid": "u-1"},
        "spec": {"slo": slo},
    }


def rule_file(tmp_path: Path, slo: dict[str, Any]) -> Path:
    """The rendered PrometheusRule's spec as a Prometheus rule file (what the Prometheus
    Operator loads from it)."""
    body = pipeline(slo)
    extras = parse_operator_spec(body["spec"])
    assert extras.slo is not None
    rule = render_prometheus_rule(body, extras.slo)
    path = tmp_path / "slo-rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    return path


FULL_SLO = {
    "maxLagSeconds": 60,
    "maxErrorRatio": 0.01,
    "maxTimeSinceLastCommitSeconds": 300,
    "alertAfterSeconds": 120,
}


def test_the_rendered_rule_is_owned_and_has_one_alert_per_objective() -> None:
    body = pipeline(FULL_SLO)
    slo = parse_operator_spec(body["spec"]).slo
    assert slo is not None
    rule = render_prometheus_rule(body, slo, {"release": "kube-prometheus-stack"})
    assert rule["kind"] == "PrometheusRule"
    assert rule["metadata"]["name"] == "orders-enrich-slo"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (owner,) = rule["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "ConsumerPipeline",
        "orders-enrich",
        "u-1",
    )
    (group,) = rule["spec"]["groups"]
    alerts = [(r["alert"], r["labels"]["severity"]) for r in group["rules"] if "alert" in r]
    assert alerts == [
        ("OfftakeSLOLagSeconds", "warning"),
        ("OfftakeSLOErrorBudgetBurn", "critical"),
        ("OfftakeSLOErrorBudgetBurn", "warning"),
        ("OfftakeSLONoCommit", "critical"),
    ]
    for r in group["rules"]:
        if r["expr"].startswith("vector("):  # an objective: the labels say whose
            assert r["labels"] == {"namespace": "obs-test", "pipeline": "orders-enrich"}
        else:
            assert 'namespace="obs-test", pipeline="orders-enrich"' in r["expr"]
    # Only the objectives that are set become alerts.
    only_lag = parse_operator_spec({"slo": {"maxLagSeconds": 30}}).slo
    assert only_lag is not None
    (group,) = render_prometheus_rule(body, only_lag)["spec"]["groups"]
    assert [r["alert"] for r in group["rules"] if "alert" in r] == ["OfftakeSLOLagSeconds"]


def test_promtool_checks_the_rendered_rules(
    prometheus_binaries: tuple[str, str], tmp_path: Path
) -> None:
    path = rule_file(tmp_path, FULL_SLO)
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    # lag: objective + max records, 1 alert; errors: objective + 5 ratio records (5m, 30m, 1h,
    # 6h, 30d), 2 burn alerts; commits: 1 alert
    assert "SUCCESS: 12 rules found" in result.stdout


def _alert(name: str, severity: str, slo: str) -> dict[str, Any]:
    """The expected alert, with the annotations the rendered rule gives it (static text)."""
    body = pipeline(FULL_SLO)
    rendered = parse_operator_spec(body["spec"]).slo
    assert rendered is not None
    (group,) = render_prometheus_rule(body, rendered)["spec"]["groups"]
    (rule,) = [
        r for r in group["rules"] if r.get("alert") == name and r["labels"]["severity"] == severity
    ]
    return {
        "exp_labels": {**STATIC_LABELS, "severity": severity, "slo": slo},
        "exp_annotations": rule["annotations"],
    }


def test_promtool_unit_tests_of_the_rendered_alerts(
    prometheus_binaries: tuple[str, str], tmp_path: Path
) -> None:
    """Each alert fires on the series that break its objective, only after alertAfterSeconds,
    and stays quiet on healthy series."""
    rules = rule_file(tmp_path, FULL_SLO)
    lbl = 'namespace="obs-test", pipeline="orders-enrich"'
    processed = "offtake_messages_processed_total"
    tests = [
        {  # lag: 90 s > 60 s from minute 1; pending for 2 m, firing from minute 3
            "interval": "1m",
            "input_series": [
                {
                    "series": f'offtake_consumer_lag_seconds{{{lbl}, topic="t", partition="0"}}',
                    "values": "10 90x10",
                },
                {
                    "series": f'offtake_consumer_lag_seconds{{{lbl}, topic="t", partition="1"}}',
                    "values": "5x10",
                },
            ],
            "alert_rule_test": [
                {"eval_time": "2m", "alertname": "OfftakeSLOLagSeconds", "exp_alerts": []},
                {
                    "eval_time": "4m",
                    "alertname": "OfftakeSLOLagSeconds",
                    "exp_alerts": [
                        {
                            **_alert("OfftakeSLOLagSeconds", "warning", "lag"),
                            "exp_annotations": {
                                "summary": "obs-test/orders-enrich is 1m 30s behind "
                                "(objective: 60 s)",
                                "description": "The oldest uncommitted record of pipeline "
                                "orders-enrich has been older than its objective "
                                "spec.slo.maxLagSeconds=60 for 120s.",
                            },
                        }
                    ],
                },
            ],
        },
        {  # errors: 20 % of records fail (20x the 1 % budget): both burn alerts fire
            "interval": "1m",
            "input_series": [
                {
                    "series": f'{processed}{{{lbl}, topic="t", outcome="delivered"}}',
                    "values": "0+80x500",
                },
                {"series": f'{processed}{{{lbl}, topic="t", outcome="dlq"}}', "values": "0+20x500"},
                {
                    "series": f'{processed}{{{lbl}, topic="t", outcome="retried"}}',
                    "values": "0+500x500",
                },
            ],
            "alert_rule_test": [
                {
                    "eval_time": "7h",
                    "alertname": "OfftakeSLOErrorBudgetBurn",
                    "exp_alerts": [
                        _alert("OfftakeSLOErrorBudgetBurn", "critical", "errors"),
                        _alert("OfftakeSLOErrorBudgetBurn", "warning", "errors"),
                    ],
                }
            ],
            "promql_expr_test": [
                {
                    "expr": f"offtake:slo_error_ratio:rate1h{{{lbl}}}",
                    "eval_time": "2h",
                    "exp_samples": [
                        {"labels": f"offtake:slo_error_ratio:rate1h{{{lbl}}}", "value": 0.2}
                    ],
                }
            ],
        },
        {  # errors at 5 % (5x the budget): below both burn rates, nothing fires
            "interval": "1m",
            "input_series": [
                {
                    "series": f'{processed}{{{lbl}, topic="t", outcome="delivered"}}',
                    "values": "0+95x500",
                },
                {
                    "series": f'{processed}{{{lbl}, topic="t", outcome="skipped"}}',
                    "values": "0+5x500",
                },
            ],
            "alert_rule_test": [
                {"eval_time": "7h", "alertname": "OfftakeSLOErrorBudgetBurn", "exp_alerts": []}
            ],
        },
        {  # lag and no commit for 300 s: fires; commits resuming silence it
            "interval": "1m",
            "input_series": [
                {
                    "series": f'offtake_consumer_lag_messages{{{lbl}, topic="t", partition="0"}}',
                    "values": "500x30",
                },
                {
                    "series": f'offtake_commits_total{{{lbl}, result="success"}}',
                    "values": "10x10 10+5x20",
                },
            ],
            "alert_rule_test": [
                {
                    "eval_time": "9m",
                    "alertname": "OfftakeSLONoCommit",
                    "exp_alerts": [_alert("OfftakeSLONoCommit", "critical", "commits")],
                },
                {"eval_time": "20m", "alertname": "OfftakeSLONoCommit", "exp_alerts": []},
            ],
        },
    ]
    test_file = tmp_path / "slo_test.yaml"
    test_file.write_text(
        yaml.safe_dump(
            {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests},
            sort_keys=False,
        )
    )
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _alert_states(prom: Prometheus, name: str) -> set[str]:
    with urllib.request.urlopen(f"{prom.url}/api/v1/alerts", timeout=5) as resp:
        alerts = json.load(resp)["data"]["alerts"]
    return {a["state"] for a in alerts if a["labels"]["alertname"] == name}


@pytest.mark.timeout(300)
def test_a_real_prometheus_fires_and_resolves_the_lag_alert_of_a_real_lagging_worker(
    prometheus_binaries: tuple[str, str], kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """A real worker is held behind a backlog until Prometheus, scraping it each second and
    evaluating the rendered rule (maxLagSeconds 3, alertAfterSeconds 4), has the alert pending
    and then firing; released, the worker catches up and the alert resolves. The hold is a
    condition (the alert fired), not a backlog sized in seconds: a loaded machine that starts
    Prometheus late must not see the worker done before the rule's `for` has passed."""
    rules = rule_file(tmp_path, {"maxLagSeconds": 3, "alertAfterSeconds": 4})
    source = f"slo-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(source, 2)
    sink = f"slo-out-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(sink, 2)
    produce(kafka_broker.bootstrap, source, range(2400), partitions=2)
    produced = time.monotonic()
    held = threading.Event()
    worker = RealWorker(
        kafka_broker.bootstrap, [source], seconds_per_record=0.0, sink_topic=sink, gate=held
    ).start()
    prom = Prometheus(
        scrape_configs=[
            {
                "job_name": SCRAPE_JOB,
                "static_configs": [{"targets": [worker.target], "labels": STATIC_LABELS}],
            }
        ],
        rule_files=[rules],
    ).start()
    seen: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 200
        while "resolved" not in seen:
            assert time.monotonic() < deadline, f"alert states seen so far: {seen}"
            states = _alert_states(prom, "OfftakeSLOLagSeconds")
            now = round(time.monotonic() - produced, 1)
            for state in states:
                seen.setdefault(state, now)
            if "firing" in seen:
                if not held.is_set():
                    held.set()  # the alert fired: let the worker catch up
                    seen["released"] = now
                elif not states:
                    seen["resolved"] = now
            time.sleep(0.5)
        lag = prom.query("max(offtake_consumer_lag_seconds)")
    finally:
        held.set()
        prom.stop()
        worker.stop()
    print(f"\nOfftakeSLOLagSeconds after the backlog was produced (s): {seen}")
    assert seen["pending"] < seen["firing"] <= seen["released"] < seen["resolved"]
    # The rule's `for` (4 s) holds between pending and firing (plus evaluation steps).
    assert seen["firing"] - seen["pending"] >= 3
    assert float(lag[0]["value"][1]) <= 3
