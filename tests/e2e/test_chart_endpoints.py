"""The chart's side of "every endpoint authenticated or local": the operator's NetworkPolicy,
what the operator is told to render for the workers (their policy is the operator's, per
pipeline, so cluster-wide installs get it too), the webhook's objectSelector and the client
CA it verifies callers against, all rendered by helm and validated by the real API server
(server-side dry run)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml

from offtake.config import parse_pipeline
from offtake_operator.reconcile import worker_manifest
from offtake_operator.render.worker_network_policy import worker_network_policies
from offtake_operator.settings import OperatorConfig
from offtake_testbed.kube import KUBE_VERSION, ControlPlane
from offtake_testbed.pytest_plugin_kube import Helm

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CHART = Path(__file__).resolve().parents[2] / "helm" / "offtake"
MONITORING = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}]


def test_chart_network_policies_object_selector_and_client_ca(
    control_plane: ControlPlane, helm: Helm
) -> None:
    ca_pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    out = helm(
        "template", "offtake", str(CHART), "-n", "offtake-system",
        "--set-json", 'operator.namespaces=["team-a","team-b"]',
        "--set-json", f"networkPolicy.metricsFrom={json.dumps(MONITORING)}",
        "--set", f"injection.clientCA={base64.b64encode(ca_pem.encode()).decode()}",
        "--kube-version", KUBE_VERSION,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(out) if d]
    by = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs}

    operator = by["NetworkPolicy", "offtake-system", "offtake-offtake-operator"]["spec"]
    assert operator["policyTypes"] == ["Ingress"]
    open_ports, metrics = operator["ingress"]
    assert "from" not in open_ports  # the API server is not a pod: the port alone
    assert {p["port"] for p in open_ports["ports"]} == {"health", "webhook"}
    assert metrics == {"ports": [{"protocol": "TCP", "port": "metrics"}], "from": MONITORING}
    # No worker policy of the chart's own: the operator renders one per pipeline, from what
    # the chart hands it.
    assert {ns for kind, ns, _ in by if kind == "NetworkPolicy"} == {"offtake-system"}

    (mwc,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    assert mwc["webhooks"][0]["objectSelector"] == {
        "matchExpressions": [{"key": "offtake.dev/pipeline", "operator": "Exists"}]
    }
    ca = by["ConfigMap", "offtake-system", "offtake-offtake-operator-webhook-client-ca"]
    assert ca["data"]["ca.crt"] == ca_pem
    dep = by["Deployment", "offtake-system", "offtake-offtake-operator"]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["OFFTAKE_WEBHOOK_CLIENT_CA_FILE"] == "/etc/offtake/webhook-client-ca/ca.crt"
    config = OperatorConfig.from_env({k: v for k, v in env.items() if v is not None})
    body = {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": "orders", "namespace": "default", "uid": "u-1"},
        "spec": {
            "kafka": {"bootstrapServers": "kafka:9092"},
            "source": {"topics": ["orders"]},
            "sink": {"log": {}},
        },
    }
    (workers,) = worker_network_policies(body, parse_pipeline(worker_manifest(body)), config)
    # The operator too: it reads queue-mode workers' backlog from their /metrics.
    the_operator = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "offtake-system"}},
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "offtake",
                "app.kubernetes.io/instance": "offtake",
                "app.kubernetes.io/component": "operator",
            }
        },
    }
    assert workers["spec"]["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": 9100}], "from": [*MONITORING, the_operator]}
    ]

    # The API server accepts every NetworkPolicy as rendered (moved to a namespace that exists),
    # the operator's for a pipeline's workers with them.
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"] + [workers]
    for i, p in enumerate(policies):
        p["metadata"]["namespace"] = "default"
        p["metadata"]["name"] += f"-{i}"
    control_plane.kubectl(
        "apply", "--dry-run=server", "-f", "-",
        input=yaml.safe_dump_all(policies),
    )  # fmt: skip

    # The admin's own client CA replaces the one the chart would generate.
    assert "offtake-offtake-operator-webhook-client" not in {n for _, _, n in by}

    off = helm(
        "template", "offtake", str(CHART), "--set", "networkPolicy.enabled=false",
        "--set", "injection.requireClientCert=false",
        "--kube-version", KUBE_VERSION,
    ).stdout  # fmt: skip
    assert "kind: NetworkPolicy" not in off
    # The opt-out: no client certificate asked for, none generated.
    assert "webhook-client" not in off
    env = {
        e["name"]: e.get("value")
        for d in yaml.safe_load_all(off)
        if d and d["kind"] == "Deployment"
        for e in d["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["OFFTAKE_WORKER_NETWORK_POLICY"] == "false"  # nor does the operator render one
    assert "OFFTAKE_WEBHOOK_CLIENT_CA_FILE" not in env
