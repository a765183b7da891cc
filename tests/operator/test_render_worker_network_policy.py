"""The workers' NetworkPolicy and probe port as the operator renders them (issue 38, item 4).

The policy admits the metrics port, from the peers the chart names, and nothing else: no rule
for the probe port, which the kubelet reaches from the node. It selects the Deployment's worker
pods and not a user's pod carrying an injected worker. The settings that turn it on come from
the chart's environment and are refused by name when malformed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from operator_testkit import pipeline_body

from offtake.config import ConfigError, parse_pipeline
from offtake_operator import render
from offtake_operator.reconcile import worker_manifest
from offtake_operator.render.worker_network_policy import policy_name, worker_network_policies
from offtake_operator.settings import OperatorConfig, SettingsError

SCRAPERS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
ON = OperatorConfig.from_env(
    {"OFFTAKE_WORKER_NETWORK_POLICY": "true", "OFFTAKE_WORKER_METRICS_FROM": json.dumps([SCRAPERS])}
)


def rendered(body: dict[str, Any], config: OperatorConfig = ON) -> list[dict[str, Any]]:
    return worker_network_policies(body, parse_pipeline(worker_manifest(body)), config)


def test_the_metrics_port_from_the_named_scrapers_and_nothing_else() -> None:
    body = pipeline_body("orders", metrics={"port": 9200, "probePort": 9300})
    (policy,) = rendered(body)
    assert policy["kind"] == "NetworkPolicy"
    assert policy["metadata"]["name"] == policy_name("orders") == "orders-workers"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": 9200}], "from": [SCRAPERS]}
    ]
    assert "9300" not in str(policy)  # the probe port: no rule, the kubelet is not a pod


def test_no_scrapers_named_admits_any_peer_to_the_metrics_port_only() -> None:
    config = OperatorConfig.from_env({"OFFTAKE_WORKER_NETWORK_POLICY": "true"})
    (policy,) = rendered(pipeline_body("orders"), config)
    assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 9100}]}]


def test_it_selects_the_deployments_workers_and_not_a_users_pod() -> None:
    body = pipeline_body("orders")
    (policy,) = rendered(body)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    pipeline = parse_pipeline(worker_manifest(body))
    pod_labels = render.render_deployment(body, pipeline, ON, replicas=1)["spec"]["template"][
        "metadata"
    ]["labels"]
    assert set(selector.items()) <= set(pod_labels.items())
    # A user's pod with an injected worker carries the pipeline label and its own, no more.
    injected = {"offtake.dev/pipeline": "orders", "offtake.dev/injected": "true", "app": "shop"}
    assert not set(selector.items()) <= set(injected.items())


def test_off_by_default_and_when_the_chart_turns_it_off() -> None:
    assert rendered(pipeline_body("orders"), OperatorConfig()) == []
    off = OperatorConfig.from_env({"OFFTAKE_WORKER_NETWORK_POLICY": "false"})
    assert rendered(pipeline_body("orders"), off) == []


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"OFFTAKE_WORKER_NETWORK_POLICY": "yes"}, "expected true or false"),
        ({"OFFTAKE_WORKER_METRICS_FROM": "{"}, "JSON list of NetworkPolicy peers"),
        ({"OFFTAKE_WORKER_METRICS_FROM": '{"podSelector": {}}'}, "JSON list"),
        ({"OFFTAKE_WORKER_METRICS_FROM": '["monitoring"]'}, "JSON list"),
    ],
)
def test_malformed_settings_are_refused_by_name(env: dict[str, str], problem: str) -> None:
    with pytest.raises(SettingsError, match=problem) as caught:
        OperatorConfig.from_env(env)
    assert next(iter(env)) in str(caught.value)


def test_the_probe_port_must_differ_from_the_metrics_port() -> None:
    body = pipeline_body("orders", metrics={"port": 9100, "probePort": 9100})
    with pytest.raises(ConfigError, match=r"spec\.metrics\.probePort: must differ"):
        parse_pipeline(worker_manifest(body))
