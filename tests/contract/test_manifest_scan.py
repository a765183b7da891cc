"""The manifest scan of scripts/lint.sh (offtake_testbed.manifest_scan) checks something: it
renders every child the operator makes for examples/, each scanner fails on a planted finding
(a scan that checks nothing passes too), and each deliberate exception carries its reason.

scripts/lint.sh runs the scan itself on the chart and the children; these tests keep it honest.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from offtake_testbed import manifest_scan, scanners
from offtake_testbed.kube import install_helm

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
POD_KINDS = ("Deployment", "Job")


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _pod_containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]["template"]["spec"]
    containers: list[dict[str, Any]] = spec["containers"] + spec.get("initContainers", [])
    return containers


def test_every_example_renders_its_children_with_resources(tmp_path: Path) -> None:
    files = manifest_scan.render_children(tmp_path)
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert [f.name for f in files] == [f"children-{e.stem}.yaml" for e in examples]
    kinds: set[str] = set()
    for path in files:
        for doc in _docs(path):
            kinds.add(doc["kind"])
            if doc["kind"] in POD_KINDS:
                for container in _pod_containers(doc):
                    resources = container.get("resources") or {}
                    # The worker's, the redrive Job's and the examples' own containers.
                    assert resources.get("requests"), (path.name, container["name"])
                    assert (resources.get("limits") or {}).get("memory"), (
                        path.name,
                        container["name"],
                    )
    assert {
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "Job",
    } <= kinds


PLANTED = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: planted, namespace: shop}
spec:
  replicas: 2
  selector: {matchLabels: {app: planted}}
  template:
    metadata: {labels: {app: planted}}
    spec:
      containers:
        - name: app
          image: planted:latest
          securityContext: {privileged: true}
---
apiVersion: v1
kind: Service
metadata: {name: unknown-field, namespace: shop}
spec:
  selector: {app: planted}
  ports: [{port: 80}]
  clusterIp: None
"""


TWICE = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: twices.example.com}
spec:
  group: example.com
  names: {kind: Twice, plural: twices}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          description: first
          description: second
"""


def test_each_scanner_fails_on_a_planted_finding(tmp_path: Path) -> None:
    planted = tmp_path / "planted.yaml"
    planted.write_text(PLANTED)
    tools = scanners.install_scanners()
    result = manifest_scan.scan_folder([planted], tools)
    assert result.failed == ["kubeconform", "kube-score", "checkov"], result.report()
    reports = {name: text for name, _, text in result.runs}
    # kubeconform: strict schemas (a misspelt field), and strict YAML: a key given twice, as
    # the CRD's description keys were (kube-score refuses such a file whole, so apart).
    assert "clusterIp" in reports["kubeconform"]
    twice = tmp_path / "twice.yaml"
    twice.write_text(TWICE)
    (run,) = manifest_scan.scan_folder([twice], tools, only=["kubeconform"]).runs
    assert run[1] != 0 and 'key "description" already set in map' in run[2], run[2]
    # kube-score: no resources, a latest tag; checkov: a privileged container.
    assert "(app) Memory limit is not set" in reports["kube-score"]
    assert "Image with latest tag" in reports["kube-score"]
    assert "CKV_K8S_16" in reports["checkov"]


def _entries_without_reason(lines: list[str], is_entry: Any) -> list[str]:
    """Entries not directly under a comment line (or another such entry sharing it)."""
    missing = []
    explained = False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            explained = True
        elif not stripped:
            explained = False
        elif is_entry(stripped) and not explained:
            missing.append(stripped)
    return missing


def test_every_deliberate_exception_has_its_reason() -> None:
    ignores = manifest_scan.KUBE_SCORE_IGNORES.read_text().splitlines()
    assert _entries_without_reason(ignores, lambda s: True) == []
    checkov = manifest_scan.CHECKOV_CONFIG.read_text().splitlines()
    assert _entries_without_reason(checkov, lambda s: s.startswith("- ")) == []
    skipped = yaml.safe_load(manifest_scan.CHECKOV_CONFIG.read_text())["skip-check"]
    assert skipped and all(str(check).startswith("CKV") for check in skipped)
    args = manifest_scan.kube_score_ignores()
    assert "--ignore-container-cpu-limit" in args
    assert "--ignore-container-memory-limit" not in args
    assert ["--ignore-test", "container-resources"] not in [
        args[i : i + 2] for i in range(len(args))
    ]


def test_checkovs_own_helm_scan_checks_the_chart_with_the_test_beds_helm() -> None:
    """checkov's helm framework renders the chart with the helm on PATH: with a helm built
    without version flags that render failed on the chart's kubeVersion floor and checkov
    reported nothing at all. Its only findings are the default namespace it renders into
    (lint renders into offtake-system)."""
    tools = scanners.install_scanners()
    env = {**os.environ, "PATH": f"{install_helm().parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [
            str(tools.checkov),
            *("-d", str(manifest_scan.CHART), "--framework", "helm"),
            *("--config-file", str(manifest_scan.CHECKOV_CONFIG)),
            *("--compact", "--skip-download", "--quiet"),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    counts = re.search(r"Passed checks: (\d+), Failed checks: (\d+)", result.stdout)
    assert counts is not None, result.stdout + result.stderr
    assert int(counts.group(1)) > 50, result.stdout
    assert set(re.findall(r"Check: (CKV\w+)", result.stdout)) <= {"CKV_K8S_21"}, result.stdout
