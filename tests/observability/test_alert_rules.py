"""The alert rules: valid for promtool, a unit test for every alert, and the chart ships them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from offtake_testbed.prometheus import promtool

from .conftest import ALERTS, ROOT

HERE = Path(__file__).resolve().parent
REQUIRED = {
    "OfftakeLagSecondsHigh",
    "OfftakeLagGrowingWhileBackpressured",
    "OfftakeDLQRate",
    "OfftakeNoCommitWhileLagging",
    "OfftakeRebalanceStorm",
    "OfftakeWorkerDown",
    "OfftakeOperatorReconcileErrors",
}


def alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def test_promtool_check_rules(prometheus_binaries: tuple[str, str]) -> None:
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_promtool_test_rules(prometheus_binaries: tuple[str, str]) -> None:
    result = promtool("test", "rules", str(HERE / "alerts_test.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_required_alerts_exist_with_severity_and_summary() -> None:
    rules = alerts()
    assert {r["alert"] for r in rules} == REQUIRED
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert rule.get("for"), f"{rule['alert']} must not fire on a single evaluation"
    (down,) = [r for r in rules if r["alert"] == "OfftakeWorkerDown"]
    assert 'up{job="offtake"} == 0' in down["expr"]


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    tests = yaml.safe_load((HERE / "alerts_test.yaml").read_text())["tests"]
    fires: set[str] = set()
    quiet: set[str] = set()
    for test in tests:
        for case in test.get("alert_rule_test", []):
            (fires if case["exp_alerts"] else quiet).add(case["alertname"])
    names = {r["alert"] for r in alerts()}
    assert names - fires == set(), f"alerts never tested firing: {names - fires}"
    assert names - quiet == set(), f"alerts never tested staying quiet: {names - quiet}"


def test_the_chart_ships_the_same_dashboard_and_rules() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "dashboards" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    chart = ROOT / "helm" / "offtake"
    assert (chart / "dashboards" / "alerts.yaml").read_bytes() == ALERTS.read_bytes()
    assert (chart / "dashboards" / "offtake.json").read_bytes() == (
        ROOT / "dashboards" / "offtake.json"
    ).read_bytes()
    rule = (chart / "templates" / "prometheusrule.yaml").read_text()
    assert "kind: PrometheusRule" in rule and '.Files.Get "dashboards/alerts.yaml"' in rule
    dash = (chart / "templates" / "grafana-dashboard-configmap.yaml").read_text()
    assert 'grafana_dashboard: "1"' in dash and '.Files.Get "dashboards/offtake.json"' in dash
