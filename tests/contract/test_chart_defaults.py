"""The chart's defaults for a shared cluster, rendered by the test bed's real helm (no cluster):
a released helm's version (so ``helm template`` passes the chart's ``kubeVersion`` floor without
``--kube-version``), the operator's readiness probe, its PodDisruptionBudget and anti-affinity
only with more than one replica, and the workers' default resources handed to the operator."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from offtake_operator.settings import (
    DEFAULT_WORKER_RESOURCES,
    DEFAULT_WORKER_SPARK_RESOURCES,
    OperatorConfig,
)
from offtake_testbed.kube import HELM_VERSION, install_helm

pytestmark = pytest.mark.timeout(300)

CHART = Path(__file__).resolve().parents[2] / "helm" / "offtake"


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(install_helm()), *args], capture_output=True, text=True, check=False
    )
    if check and result.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} exited {result.returncode}: {result.stderr}")
    return result


def render(*sets: str) -> list[dict[str, Any]]:
    """``helm template`` of the chart, as a released helm runs it: no --kube-version."""
    args = [a for s in sets for a in ("--set", s)]
    out = helm("template", "offtake", str(CHART), "-n", "offtake-system", *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def the(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def operator_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = the(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


def test_helm_is_a_release_build_that_knows_its_kubernetes_version(tmp_path: Path) -> None:
    assert helm("version", "--template", "{{.Version}}").stdout == HELM_VERSION
    # helm 3.19's client libraries are Kubernetes 1.34's: a chart asking for 1.34 renders
    # without a cluster and without --kube-version (an unflagged build assumed v1.20), and
    # one asking for more than helm knows is refused naming kubeVersion.
    for floor, renders in ((">=1.34.0-0", True), (">=1.35.0-0", False)):
        chart = tmp_path / f"floor{floor[2:6]}"
        (chart / "templates").mkdir(parents=True)
        (chart / "Chart.yaml").write_text(
            f"apiVersion: v2\nname: floor\nversion: 0.1.0\nkubeVersion: '{floor}'\n"
        )
        (chart / "templates" / "cm.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"
            "data: {kube: '{{ .Capabilities.KubeVersion.Version }}'}\n"
        )
        result = helm("template", "x", str(chart), check=False)
        if renders:
            assert result.returncode == 0, result.stderr
            assert yaml.safe_load(result.stdout)["data"]["kube"].startswith("v1.34.")
        else:
            assert result.returncode != 0
            assert "kubeVersion" in result.stderr


def test_the_chart_renders_without_kube_version() -> None:
    kinds = {d["kind"] for d in render()}
    assert {"Deployment", "ServiceAccount", "ClusterRole"} <= kinds


def test_the_operator_has_a_readiness_probe_on_kopfs_health_endpoint() -> None:
    (container,) = operator_pod(render())["containers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8080} in container["ports"]


def test_one_operator_replica_gets_no_pdb_and_no_anti_affinity() -> None:
    docs = render()
    assert "PodDisruptionBudget" not in {d["kind"] for d in docs}
    assert "affinity" not in operator_pod(docs)


def test_more_replicas_get_a_pdb_and_anti_affinity_over_nodes() -> None:
    docs = render("operator.replicas=3")
    deployment = the(docs, "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    pdb = the(docs, "PodDisruptionBudget")
    assert pdb["metadata"]["namespace"] == "offtake-system"
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    (term,) = operator_pod(docs)["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"] == {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": selector},
    }
    # The pod labels the PDB and the anti-affinity select are the operator pods' own.
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_the_users_own_affinity_replaces_the_default_one() -> None:
    docs = render("operator.replicas=2", "operator.affinity.nodeAffinity.x=y")
    assert operator_pod(docs)["affinity"] == {"nodeAffinity": {"x": "y"}}
    assert the(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


def _settings(docs: list[dict[str, Any]]) -> OperatorConfig:
    (container,) = operator_pod(docs)["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return OperatorConfig.from_env(env)


def test_the_charts_worker_resources_are_the_operators_defaults() -> None:
    config = _settings(render())
    assert config.worker_resources == DEFAULT_WORKER_RESOURCES
    assert config.worker_spark_resources == DEFAULT_WORKER_SPARK_RESOURCES


def test_worker_resources_set_in_values_reach_the_operator() -> None:
    config = _settings(
        render("worker.resources.limits.memory=2Gi", "worker.sparkResources.requests.cpu=2")
    )
    assert config.worker_resources == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "2Gi"},
    }
    assert config.worker_spark_resources["requests"] == {"cpu": 2, "memory": "1536Mi"}
    assert json.dumps(config.worker_spark_resources)  # plain JSON, as the operator renders it


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("worker.resources.request.cpu=1", "request"),
        ("worker.resources.limits.memory=true", "memory"),
    ],
)
def test_bad_worker_resources_fail_at_template_naming_the_value(value: str, named: str) -> None:
    result = helm("template", "offtake", str(CHART), "--set", value, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert named in result.stderr
