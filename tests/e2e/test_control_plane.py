"""The Kubernetes test bed itself: a real apiserver, CRDs, and the controller-manager at work.

Needs the ``offtake_testbed.pytest_plugin_kube`` fixtures (registered in tests/conftest.py, or
``pytest -p offtake_testbed.pytest_plugin_kube``).
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from offtake_testbed.kube import KUBE_VERSION, ControlPlane, install_control_plane
from offtake_testbed.pytest_plugin_kube import Helm, Kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

T = TypeVar("T")

CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.testbed.offtake.dev
spec:
  group: testbed.offtake.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wdg]}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              required: [size]
              properties:
                size: {type: integer, minimum: 1}
      subresources: {status: {}}
"""

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
        - {name: web, image: registry.invalid/never-pulled:1}
"""


def eventually(check: Callable[[], T | None], timeout: float = 60.0, what: str = "") -> T:
    """Poll ``check`` until it returns something other than None/False/empty."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.25)


def get_items(kubectl: Kubectl, *args: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(kubectl("get", *args, "-o", "json").stdout)["items"]
    return items


def test_cached_install_builds_nothing(
    control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    def build_again(*args: object, **kwargs: object) -> str:
        raise AssertionError("a cached install ran the Go tool again")

    monkeypatch.setattr("offtake_testbed.kube.install.run_go", build_again)
    paths = install_control_plane()
    assert paths.version == KUBE_VERSION
    assert control_plane.paths.kube_apiserver.is_file()


def test_apiserver_is_ready(control_plane: ControlPlane) -> None:
    request = urllib.request.Request(f"{control_plane.server}/readyz?verbose")
    request.add_header("Authorization", f"Bearer {control_plane.token}")
    context = ssl.create_default_context(cafile=str(control_plane.ca_file))
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        body = response.read().decode()
    assert response.status == 200
    assert "readyz check passed" in body

    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == KUBE_VERSION
    assert version["clientVersion"]["gitVersion"] == KUBE_VERSION


def test_kubeconfig_is_self_contained(control_plane: ControlPlane, tmp_path: Path) -> None:
    copy = tmp_path / "kubeconfig"
    copy.write_bytes(control_plane.kubeconfig.read_bytes())
    out = control_plane.kubectl(f"--kubeconfig={copy}", "auth", "can-i", "*", "*").stdout
    assert out.strip() == "yes"


def test_custom_resource_definition(
    control_plane: ControlPlane, kubectl: Kubectl, kube_namespace: str
) -> None:
    kubectl("apply", "-f", "-", input=CRD)
    try:
        kubectl(
            "wait",
            "--for=condition=Established",
            "crd/widgets.testbed.offtake.dev",
            "--timeout=60s",
        )
        widget = {
            "apiVersion": "testbed.offtake.dev/v1",
            "kind": "Widget",
            "metadata": {"name": "w1", "namespace": kube_namespace},
            "spec": {"size": 3},
        }
        control_plane.apply(widget)

        widgets = control_plane.get_json("widgets", "-n", kube_namespace)["items"]
        assert [(w["metadata"]["name"], w["spec"]["size"]) for w in widgets] == [("w1", 3)]
        assert kubectl("get", "wdg", "w1", "-n", kube_namespace, "-o", "name").stdout.strip() == (
            "widget.testbed.offtake.dev/w1"
        )

        # The schema is enforced by the real apiserver.
        bad = {**widget, "metadata": {"name": "w2", "namespace": kube_namespace}}
        bad["spec"] = {"size": 0}
        rejected = kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
        assert rejected.returncode != 0
        assert "spec.size" in rejected.stderr
    finally:
        kubectl("delete", "crd", "widgets.testbed.offtake.dev", "--wait=false", check=False)


def test_deployment_gets_replicaset_and_garbage_collection(
    kubectl: Kubectl, kube_namespace: str
) -> None:
    ns = ("-n", kube_namespace)
    kubectl("apply", *ns, "-f", "-", input=DEPLOYMENT)
    uid = json.loads(kubectl("get", *ns, "deployment/web", "-o", "json").stdout)["metadata"]["uid"]

    def owned_replicasets() -> list[dict[str, Any]]:
        return [
            rs
            for rs in get_items(kubectl, *ns, "replicasets")
            if any(ref["uid"] == uid for ref in rs["metadata"].get("ownerReferences", []))
        ]

    replicasets = eventually(owned_replicasets, what="the deployment's ReplicaSet")
    assert len(replicasets) == 1
    assert replicasets[0]["spec"]["replicas"] == 2
    # The ReplicaSet controller creates the Pod objects (nothing runs them: there is no kubelet).
    eventually(
        lambda: len(get_items(kubectl, *ns, "pods", "-l", "app=web")) == 2,
        what="the ReplicaSet's two pods",
    )

    kubectl("delete", *ns, "deployment/web", "--wait=false")
    eventually(lambda: not owned_replicasets(), what="garbage collection of the ReplicaSet")
    eventually(
        lambda: not get_items(kubectl, *ns, "pods", "-l", "app=web"),
        what="garbage collection of the pods",
    )


def test_helm_installs_a_chart(
    helm: Helm, kubectl: Kubectl, kube_namespace: str, tmp_path: Path
) -> None:
    chart = tmp_path / "hello"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        "apiVersion: v2\nname: hello\nversion: 0.1.0\nkubeVersion: '>=1.30.0-0'\n"
    )
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: '{{ .Release.Name }}-info'}\n"
        "data: {kube: '{{ .Capabilities.KubeVersion.Version }}'}\n"
    )
    helm("install", "greet", str(chart), "-n", kube_namespace)
    data = json.loads(kubectl("get", "-n", kube_namespace, "cm/greet-info", "-o", "json").stdout)
    assert data["data"]["kube"] == KUBE_VERSION
    helm("uninstall", "greet", "-n", kube_namespace)
    assert kubectl("get", "-n", kube_namespace, "cm/greet-info", check=False).returncode != 0
