"""Attack: name a pipeline after objects someone else made, then delete it (issue 23 item 3).

On the real kube-apiserver and kube-controller-manager (its garbage collector included): a
Deployment, a ConfigMap ``<name>-pipeline`` and a Service ``<name>-metrics`` created as
kubectl or Helm would (no ownerReferences) must come through a pipeline of that name, and its
deletion, unchanged; the pipeline says which objects hold its names. A ConfigMap left by an
earlier pipeline of the same name (Offtake's labels) is adopted, and the garbage collector
removing it with its new owner proves the collector ran while the others survived.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.kube import consumer_pipeline, exists, get, operator_running, wait_for

from offtake_testbed.kube import ControlPlane
from offtake_testbed.pytest_plugin_kube import Kubectl

os.environ.setdefault("OFFTAKE_TICK_SECONDS", "1")

from offtake_operator.settings import OperatorConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane) -> Iterator[None]:
    control_plane.kubectl("apply", "-f", str(ROOT / "crds" / "consumerpipeline.yaml"))
    control_plane.kubectl(
        "wait", "--for=condition=Established", "crd/consumerpipelines.offtake.dev"
    )
    config = OperatorConfig(resync_seconds=2, lag_interval_seconds=60, kafka_timeout_seconds=2)
    with operator_running(control_plane, config):
        yield


def pipeline(name: str) -> dict[str, Any]:
    spec = {
        "kafka": {"bootstrapServers": "kafka:9092"},
        "source": {"topics": ["orders"]},
        "sink": {"log": {}},
        "replicas": 1,
    }
    return consumer_pipeline(name, spec)


def team_objects(name: str) -> list[dict[str, Any]]:
    """Another team's objects under the names a pipeline ``name`` would give its children."""
    labels = {"app": "billing", "app.kubernetes.io/managed-by": "Helm"}
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "billing"}},
                "template": {
                    "metadata": {"labels": {"app": "billing"}},
                    "spec": {"containers": [{"name": "billing", "image": "team-b/billing:7"}]},
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{name}-pipeline", "labels": labels},
            "data": {"billing.conf": "owner=team-b"},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": f"{name}-metrics", "labels": labels},
            "spec": {"selector": {"app": "billing"}, "ports": [{"port": 7070}]},
        },
    ]


def snapshot(kubectl: Kubectl, ns: str, kind: str, name: str) -> dict[str, Any]:
    """What must not change: resourceVersion (not the Deployment's: its controller writes
    status), labels, content, owners and field managers."""
    obj = get(kubectl, kind, name, "-n", ns)
    meta = obj["metadata"]
    return {
        "resourceVersion": meta["resourceVersion"] if kind != "Deployment" else None,
        "generation": meta.get("generation"),
        "labels": meta.get("labels"),
        "annotations": meta.get("annotations"),
        "ownerReferences": meta.get("ownerReferences"),
        "managers": sorted({f["manager"] for f in meta.get("managedFields") or []}),
        "content": obj.get("data") or obj.get("spec"),
    }


def test_a_pipeline_named_after_other_objects_changes_none_and_its_deletion_spares_them(
    kubectl: Kubectl, kube_namespace: str, operator: None
) -> None:
    ns = kube_namespace
    objects = team_objects("billing")
    # As kubectl or Helm create them: no ownerReferences, not Offtake's labels.
    kubectl("create", "-n", ns, "-f", "-", input=yaml.safe_dump_all(objects))
    targets = [(o["kind"], o["metadata"]["name"]) for o in objects]

    def settled() -> bool:  # the Deployment controller's first status write, before comparing
        status = get(kubectl, "deployment", "billing", "-n", ns).get("status") or {}
        return status.get("observedGeneration") == 1 and bool(status.get("conditions"))

    wait_for(settled, timeout=30, what="billing's Deployment observed by its controller")
    before = {t: snapshot(kubectl, ns, *t) for t in targets}
    assert all(s["ownerReferences"] is None for s in before.values())

    # A ConfigMap left by an earlier pipeline "fresh" (Offtake's labels, no owner): adopted.
    leftover = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "fresh-pipeline",
            "labels": {
                "app.kubernetes.io/managed-by": "offtake-operator",
                "offtake.dev/pipeline": "fresh",
            },
        },
        "data": {"pipeline.yaml": "stale"},
    }
    kubectl("create", "-n", ns, "-f", "-", input=yaml.safe_dump(leftover))

    docs = yaml.safe_dump_all([pipeline("billing"), pipeline("fresh")])
    kubectl("apply", "-n", ns, "-f", "-", input=docs)

    def name_taken() -> dict[str, Any] | None:
        status = get(kubectl, "cpl", "billing", "-n", ns).get("status") or {}
        conds = {c["type"]: c for c in status.get("conditions") or []}
        ready = conds.get("Ready") or {}
        return ready if ready.get("reason") == "NameTaken" else None

    ready = wait_for(name_taken, timeout=60, what="billing's Ready condition NameTaken")
    assert ready["status"] == "False"
    for where in (f"Deployment {ns}/billing", f"ConfigMap {ns}/billing-pipeline"):
        assert where in ready["message"], ready["message"]
    assert f"Service {ns}/billing-metrics" in ready["message"]

    def warning() -> list[dict[str, Any]]:
        events = get(
            kubectl,
            "events",
            "-n",
            ns,
            "--field-selector",
            "involvedObject.kind=ConsumerPipeline,involvedObject.name=billing,reason=NameTaken",
        )["items"]
        return [e for e in events if f"ConfigMap {ns}/billing-pipeline" in e["message"]]

    (event,) = wait_for(warning, timeout=30, what="a NameTaken Event naming the ConfigMap")
    assert event["type"] == "Warning"
    assert "rename the pipeline" in event["message"]

    # The adopted leftover: owned by "fresh" now, and rewritten.
    def adopted() -> dict[str, Any] | None:
        cm = get(kubectl, "configmap", "fresh-pipeline", "-n", ns)
        refs = cm["metadata"].get("ownerReferences") or []
        return cm if refs and cm["data"].get("pipeline.yaml") != "stale" else None

    cm = wait_for(adopted, timeout=60, what="fresh-pipeline adopted by ConsumerPipeline fresh")
    fresh_uid = get(kubectl, "cpl", "fresh", "-n", ns)["metadata"]["uid"]
    assert [r["uid"] for r in cm["metadata"]["ownerReferences"]] == [fresh_uid]
    wait_for(lambda: exists(kubectl, "deployment", "fresh", "-n", ns), what="fresh's Deployment")

    # Several passes of billing (resync every 2 s) have run by now; nothing moved.
    assert not exists(kubectl, "pdb", "billing", "-n", ns), "no child of billing was made"
    assert {t: snapshot(kubectl, ns, *t) for t in targets} == before

    kubectl("delete", "cpl", "billing", "fresh", "-n", ns, "--timeout=60s")
    # The garbage collector runs: fresh's children (the adopted ConfigMap too) are collected.
    for kind, name in [("deployment", "fresh"), ("configmap", "fresh-pipeline")]:
        wait_for(
            lambda k=kind, n=name: not exists(kubectl, k, n, "-n", ns),
            timeout=60,
            what=f"{kind} {name} collected",
        )
    # ... and spares every object billing did not make, untouched.
    assert {t: snapshot(kubectl, ns, *t) for t in targets} == before
