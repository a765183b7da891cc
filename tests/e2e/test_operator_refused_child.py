"""A child the API server refuses is said in the pipeline's status, its Events and `kubectl
offtake status`, and clears once a pass applies it (the node tier's Spark run found a refused
Deployment retried 26 times while status said Paused).

On the real kube-apiserver: a pipeline whose template's env names a variable twice makes a
Deployment that server-side apply refuses (a 500 naming the field path, kubernetes#121575); a
ResourceQuota full for ConfigMaps refuses the pipeline's ConfigMap (403), and a
ValidatingAdmissionPolicy (the API server's own admission, refusing as a webhook would) its
PodDisruptionBudget; raising the quota or deleting the policy, without touching the pipeline,
lets the next pass through.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.kube import consumer_pipeline, exists, get, operator_running, patch, wait_for

from offtake_testbed.kube import ControlPlane
from offtake_testbed.pytest_plugin_kube import Kubectl

os.environ.setdefault("OFFTAKE_TICK_SECONDS", "1")

from offtake_operator.kubectl import cli
from offtake_operator.settings import OperatorConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
#: The message's field path and error, as server-side apply names them.
DUPLICATE = (
    'spec.template.spec.containers[name="worker"].env: '
    'duplicate entries for key [name="EXTRA_SETTING"]'
)


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane) -> Iterator[None]:
    control_plane.kubectl("apply", "-f", str(ROOT / "crds" / "consumerpipeline.yaml"))

    # Not `kubectl wait --for=condition=Established`: right after the apply the CRD may have no
    # status.conditions yet, and kubectl 1.34 then fails ("accessor error") instead of waiting.
    def established() -> bool:
        crd = get(control_plane.kubectl, "crd", "consumerpipelines.offtake.dev")
        conds = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    wait_for(established, timeout=60, what="the ConsumerPipeline CRD established")
    config = OperatorConfig(resync_seconds=2, lag_interval_seconds=60, kafka_timeout_seconds=2)
    with operator_running(control_plane, config):
        yield


def pipeline(name: str, env: list[dict[str, str]]) -> dict[str, Any]:
    spec = {
        "kafka": {"bootstrapServers": "kafka:9092"},
        "source": {"topics": ["orders"]},
        "sink": {"log": {}},
        "replicas": 1,
        # Paused as on the node tier's run: the phase said Paused while nothing was applied.
        "paused": True,
        "template": {"spec": {"env": env}},
    }
    return consumer_pipeline(name, spec)


def conditions(kubectl: Kubectl, ns: str, name: str) -> dict[str, dict[str, Any]]:
    status = get(kubectl, "cpl", name, "-n", ns).get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or []}


def refused(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any] | None:
    """The pipeline's status once its Ready condition says a child was rejected."""
    status = get(kubectl, "cpl", name, "-n", ns).get("status") or {}
    ready = {c["type"]: c for c in status.get("conditions") or []}.get("Ready") or {}
    return status if ready.get("reason") == "ChildRejected" else None


def warnings(kubectl: Kubectl, ns: str, name: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind=ConsumerPipeline,involvedObject.name={name}"
    events = get(kubectl, "events", "-n", ns, "--field-selector", selector)["items"]
    return [e for e in events if e["reason"] == "ChildRejected"]


def plugin_status(control_plane: ControlPlane, ns: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    argv = ["status", "--kubeconfig", str(control_plane.kubeconfig), "-n", ns]
    code = cli.main(argv, out=out, err=err)
    assert code == 0, err.getvalue()
    return out.getvalue()


def test_a_refused_deployment_is_said_in_status_event_and_plugin_and_clears_when_fixed(
    control_plane: ControlPlane, kubectl: Kubectl, kube_namespace: str, operator: None
) -> None:
    ns = kube_namespace
    env = [{"name": "EXTRA_SETTING", "value": "a"}, {"name": "EXTRA_SETTING", "value": "b"}]
    kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(pipeline("orders", env)))

    status = wait_for(lambda: refused(kubectl, ns, "orders"), timeout=60, what="ChildRejected")
    assert status["phase"] == "Failed", status  # not Paused: nothing of the spec was applied
    conds = conditions(kubectl, ns, "orders")
    message = conds["Ready"]["message"]
    assert message.startswith("Deployment orders was rejected by the API server (500 "), message
    assert DUPLICATE in message, message
    assert conds["Ready"]["status"] == "False"
    assert conds["Degraded"]["status"] == "True"
    assert conds["Degraded"]["reason"] == "ChildRejected"
    assert conds["Degraded"]["message"] == message
    assert not exists(kubectl, "deployment", "orders", "-n", ns)

    (event,) = wait_for(lambda: warnings(kubectl, ns, "orders"), timeout=30, what="an Event")
    assert event["type"] == "Warning" and DUPLICATE in event["message"], event

    listed = plugin_status(control_plane, ns)
    assert "ChildRejected" in listed and "Deployment orders was rejected" in listed, listed

    # Fixed in the pipeline: the next pass applies the Deployment and the condition clears.
    fixed = [{"name": "EXTRA_SETTING", "value": "a"}]
    patch(kubectl, ns, "cpl/orders", {"spec": {"template": {"spec": {"env": fixed}}}})

    def paused() -> dict[str, Any] | None:
        conds = conditions(kubectl, ns, "orders")
        return conds if (conds.get("Ready") or {}).get("reason") == "Paused" else None

    conds = wait_for(paused, timeout=60, what="Ready back to Paused")
    assert conds["Degraded"]["status"] == "False", conds
    assert get(kubectl, "cpl", "orders", "-n", ns)["status"]["phase"] == "Paused"
    deployment = get(kubectl, "deployment", "orders", "-n", ns)
    (worker,) = deployment["spec"]["template"]["spec"]["containers"]
    assert [e for e in worker["env"] if e["name"] == "EXTRA_SETTING"] == fixed
    assert len(warnings(kubectl, ns, "orders")) == 1  # one Event, not one per retry


def test_a_quota_that_refuses_the_configmap_is_said_and_clears_when_raised(
    kubectl: Kubectl, kube_namespace: str, operator: None
) -> None:
    ns = kube_namespace
    # The namespace holds one ConfigMap already (kube-root-ca.crt): no room for the pipeline's.
    kubectl("create", "quota", "cms", "-n", ns, "--hard=count/configmaps=1")
    manifest = pipeline("billing", [{"name": "EXTRA_SETTING", "value": "a"}])
    kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest))

    status = wait_for(lambda: refused(kubectl, ns, "billing"), timeout=60, what="ChildRejected")
    assert status["phase"] == "Failed", status
    message = conditions(kubectl, ns, "billing")["Degraded"]["message"]
    assert message.startswith(
        "ConfigMap billing-pipeline was rejected by the API server (403 Forbidden): "
    ), message
    assert "exceeded quota: cms" in message, message

    # Raised by the namespace's admin, the pipeline untouched: a later pass (the resync)
    # applies the children and the condition clears.
    patch(kubectl, ns, "quota/cms", {"spec": {"hard": {"count/configmaps": "5"}}})

    def applied() -> dict[str, Any] | None:
        conds = conditions(kubectl, ns, "billing")
        return conds if (conds.get("Degraded") or {}).get("status") == "False" else None

    conds = wait_for(applied, timeout=60, what="Degraded False once the quota is raised")
    assert conds["Ready"]["reason"] == "Paused", conds
    assert exists(kubectl, "configmap", "billing-pipeline", "-n", ns)
    assert exists(kubectl, "deployment", "billing", "-n", ns)


def admission_policy(ns: str) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy (the API server's own admission, as a webhook would refuse)
    that denies PodDisruptionBudgets in ``ns`` only, and its binding."""
    name = f"no-pdbs-{ns}"
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["policy"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["poddisruptionbudgets"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "false",
                        "messageExpression": (
                            "'PDBs are the platform team\\'s: ' + object.metadata.name"
                        ),
                    }
                ],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}
                },
            },
        },
    ]


def test_an_admission_policys_denial_is_said_and_clears_when_lifted(
    kubectl: Kubectl, kube_namespace: str, operator: None
) -> None:
    ns = kube_namespace
    policy = yaml.safe_dump_all(admission_policy(ns))
    kubectl("apply", "-f", "-", input=policy)
    try:
        manifest = pipeline("audit", [{"name": "EXTRA_SETTING", "value": "a"}])

        def denies() -> bool:  # the policy is in force once the API server's cache has it
            probe = {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "probe"},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"a": "b"}}},
            }
            done = kubectl(
                "create", "-n", ns, "--dry-run=server", "-f", "-",
                input=yaml.safe_dump(probe), check=False,
            )  # fmt: skip
            return done.returncode != 0 and "platform team" in done.stderr

        wait_for(denies, timeout=60, what="the admission policy in force")
        kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest))
        status = wait_for(lambda: refused(kubectl, ns, "audit"), timeout=60, what="rejected")
        assert status["phase"] == "Failed", status
        message = conditions(kubectl, ns, "audit")["Degraded"]["message"]
        assert message.startswith("PodDisruptionBudget audit was rejected by the API server"), (
            message
        )
        assert "PDBs are the platform team's: audit" in message, message
    finally:
        kubectl("delete", "-f", "-", "--ignore-not-found", input=policy)

    def applied() -> dict[str, Any] | None:
        conds = conditions(kubectl, ns, "audit")
        return conds if (conds.get("Degraded") or {}).get("status") == "False" else None

    wait_for(applied, timeout=60, what="Degraded False once the policy is gone")
    assert exists(kubectl, "pdb", "audit", "-n", ns)
