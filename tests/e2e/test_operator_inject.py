"""spec.mode: inject on a real control plane: the API server calls the operator's admission
webhook (kopf's server, TLS on loopback) for every pod it creates, including the pods the
controller-manager's ReplicaSets create for a Deployment.

The webhook configuration is the Helm chart's own (``helm template``, with ``injection.url``
pointing the API server at the operator in this process). No node runs the pods here: what is
checked is what the API server stores (tests/node runs them, with records flowing).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.inject import (
    install_crd,
    make_namespace,
    operator_with_webhook,
    webhook_configured,
    webhook_settings,
)
from support.kube import consumer_pipeline, exists, get, operator_running, wait_for

from offtake_testbed.kube import ControlPlane
from offtake_testbed.pytest_plugin_kube import Kubectl

os.environ.setdefault("OFFTAKE_TICK_SECONDS", "1")

from offtake_operator import names
from offtake_operator.context import OperatorContext
from offtake_operator.settings import DEFAULT_WORKER_RESOURCES, OperatorConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def served(control_plane: ControlPlane) -> Iterator[tuple[str, str]]:
    """(a namespace the operator serves, one it does not)."""
    kubectl = control_plane.kubectl
    install_crd(kubectl)
    ns, other = make_namespace(kubectl, "inj"), make_namespace(kubectl, "noinj")
    try:
        yield ns, other
    finally:
        for n in (ns, other):
            kubectl("delete", "namespace", n, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, served: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorContext]:
    # The chart's selector lists the served namespace only: the operator is not even asked
    # about pods elsewhere (test_unserved_namespace_and_bad_references).
    folder = tmp_path_factory.mktemp("webhook")
    settings = {"worker_image": "offtake:e2e", "resync_seconds": 2.0, "lag_source": "off"}
    with operator_with_webhook(control_plane, served[0], folder, **settings) as ctx:
        yield ctx


def inject_pipeline(name: str, **spec: Any) -> dict[str, Any]:
    defaults = {
        "mode": "inject",
        "kafka": {"bootstrapServers": "kafka:9092", "secretRef": {"name": "kafka-credentials"}},
        "source": {"topics": ["orders"]},
        "processor": {"container": {"port": 8080}},
        "sink": {"log": {}},
    }
    return consumer_pipeline(name, {**defaults, **spec})


def app_deployment(name: str, pipeline: str | None, replicas: int = 2) -> dict[str, Any]:
    annotations = {names.INJECT_ANNOTATION: pipeline} if pipeline else {}
    # The label lets the API server send the pod to the webhook (the chart's objectSelector).
    labels = {"app": name, **({names.PIPELINE_LABEL: pipeline} if pipeline else {})}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {
                    "containers": [
                        {
                            "name": "app",
                            "image": "registry.example/app:1",
                            "ports": [{"containerPort": 8080}],
                        }
                    ]
                },
            },
        },
    }


def app_pod(name: str, pipeline: str | None) -> dict[str, Any]:
    spec = app_deployment(name, pipeline)["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **spec["metadata"]},
        "spec": spec["spec"],
    }


def apply(
    kubectl: Kubectl, ns: str, obj: dict[str, Any], check: bool = True
) -> subprocess.CompletedProcess[str]:
    return kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(obj), check=check)


def pods_of(kubectl: Kubectl, ns: str, app: str) -> list[dict[str, Any]]:
    return list(get(kubectl, "pods", "-n", ns, "-l", f"app={app}")["items"])


def worker_of(pod: dict[str, Any]) -> dict[str, Any] | None:
    for c in pod["spec"].get("initContainers") or []:
        if c["name"] == names.INJECTED_CONTAINER:
            return dict(c)
    return None


def test_annotated_deployment_pods_get_the_worker_as_a_native_sidecar(
    control_plane: ControlPlane, served: tuple[str, str], operator: OperatorContext
) -> None:
    kubectl = control_plane.kubectl
    ns, _ = served
    kubectl(
        "create",
        "secret",
        "generic",
        "kafka-credentials",
        "-n",
        ns,
        "--from-literal=sasl.password=x",
    )
    apply(kubectl, ns, inject_pipeline("orders"))
    # The pipeline renders its config and metrics Service, and no Deployment of its own.
    wait_for(lambda: get(kubectl, "configmap", "orders-pipeline", "-n", ns), what="the ConfigMap")
    apply(kubectl, ns, app_deployment("shop", "orders"))
    apply(kubectl, ns, app_deployment("plain", None, replicas=1))

    pods = wait_for(
        lambda: len(pods_of(kubectl, ns, "shop")) == 2 and pods_of(kubectl, ns, "shop"),
        what="2 pods",
    )
    for pod in pods:
        worker = worker_of(pod)
        assert worker is not None, pod["spec"]
        assert worker["restartPolicy"] == "Always" and worker["image"] == "offtake:e2e"
        sc = worker["securityContext"]
        assert sc["runAsNonRoot"] and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]} and sc["readOnlyRootFilesystem"]
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        # The operator's default worker resources, as the API server stored them in the pod.
        assert worker["resources"] == DEFAULT_WORKER_RESOURCES
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["offtake-pipeline"]["configMap"]["name"] == "orders-pipeline"
        assert volumes["offtake-kafka-secret"]["secret"]["secretName"] == "kafka-credentials"
        app = pod["spec"]["containers"][0]
        assert app["lifecycle"]["preStop"]["httpGet"]["path"] == "/drain"
        assert pod["metadata"]["labels"][names.PIPELINE_LABEL] == "orders"
        assert pod["metadata"]["annotations"][names.INJECTED_ANNOTATION]
    (plain,) = wait_for(lambda: pods_of(kubectl, ns, "plain"), what="the plain pod")
    assert worker_of(plain) is None and "lifecycle" not in plain["spec"]["containers"][0]
    assert names.PIPELINE_LABEL not in plain["metadata"].get("labels", {})

    assert (
        kubectl("get", "deployment", "orders", "-n", ns, "--ignore-not-found", "-o", "name").stdout
        == ""
    )

    def listed() -> Any:
        st = get(kubectl, "cpl", "orders", "-n", ns).get("status") or {}
        injected = st.get("injectedPods") or []
        return len(injected) == 2 and st

    st = wait_for(listed, timeout=60, what="status.injectedPods of both pods")
    assert {p["name"] for p in st["injectedPods"]} == {p["metadata"]["name"] for p in pods}
    assert all(p["updated"] and not p["ready"] for p in st["injectedPods"])  # nothing runs them
    assert st["replicas"] == 2 and st["readyReplicas"] == 0 and st["phase"] == "Pending"


def test_unserved_namespace_and_bad_references(
    control_plane: ControlPlane, served: tuple[str, str], operator: OperatorContext
) -> None:
    kubectl = control_plane.kubectl
    ns, other = served
    # A namespace the operator does not serve: the webhook is not even called.
    apply(kubectl, other, inject_pipeline("orders"))
    apply(kubectl, other, app_pod("p1", "orders"))
    pod = get(kubectl, "pod", "p1", "-n", other)
    assert worker_of(pod) is None and "lifecycle" not in pod["spec"]["containers"][0]
    # A served namespace, but no such pipeline: refused, naming the annotation.
    refused = apply(kubectl, ns, app_pod("p2", "nope"), check=False)
    assert refused.returncode != 0
    assert (
        f"{names.INJECT_ANNOTATION}=nope: no ConsumerPipeline 'nope' with spec.mode: inject "
        f"and a valid spec in namespace {ns!r}" in refused.stderr
    )
    # A pipeline that runs its own Deployment: refused too.
    own = inject_pipeline("own", mode="deployment", processor={"container": {"image": "x:1"}})
    apply(kubectl, ns, own)
    refused = apply(kubectl, ns, app_pod("p3", "own"), check=False)
    # The same answer: a review's refusal never tells what the namespace holds.
    assert refused.returncode != 0
    assert "no ConsumerPipeline 'own' with spec.mode: inject" in refused.stderr


def test_a_deleted_pipeline_is_reported_on_its_pods(
    control_plane: ControlPlane, served: tuple[str, str], operator: OperatorContext
) -> None:
    kubectl = control_plane.kubectl
    ns, _ = served
    apply(kubectl, ns, inject_pipeline("gone", kafka={"bootstrapServers": "kafka:9092"}))
    wait_for(lambda: get(kubectl, "configmap", "gone-pipeline", "-n", ns), what="the ConfigMap")
    apply(kubectl, ns, app_pod("orphan", "gone"))
    assert worker_of(get(kubectl, "pod", "orphan", "-n", ns)) is not None
    kubectl("delete", "cpl", "gone", "-n", ns, "--wait=true", "--timeout=60s")

    def warned() -> Any:
        events = get(kubectl, "events", "-n", ns, "--field-selector", "involvedObject.name=orphan")
        return [e for e in events["items"] if e["reason"] == "PipelineDeleted"]

    (event,) = wait_for(warned, timeout=60, what="a PipelineDeleted event on the pod")
    assert event["type"] == "Warning" and "ConsumerPipeline gone was deleted" in event["message"]


def test_the_example_is_admitted_in_a_restricted_namespace(
    control_plane: ControlPlane, served: tuple[str, str], operator: OperatorContext
) -> None:
    """examples/inject.yaml and its Deployment, with Pod Security ``restricted`` enforced: the
    API server checks the pod after the webhook patched it, so the injected worker must pass."""
    kubectl = control_plane.kubectl
    ns, _ = served
    kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    kubectl(  # the example's spec.kafka.secretRef (the first test may have made it already)
        "create", "secret", "generic", "kafka-credentials", "-n", ns,
        "--from-literal=sasl.password=x", check=False,
    )  # fmt: skip
    kubectl("apply", "-n", ns, "-f", str(ROOT / "examples" / "inject.yaml"))
    wait_for(lambda: get(kubectl, "configmap", "orders-score-pipeline", "-n", ns), what="config")
    kubectl("apply", "-n", ns, "-f", str(ROOT / "examples" / "inject" / "deployment.yaml"))
    pods = wait_for(
        lambda: len(items := pods_of(kubectl, ns, "orders-scorer")) == 3 and items,
        timeout=60,
        what="the example's 3 pods admitted",
    )
    for pod in pods:
        worker = worker_of(pod)
        assert worker is not None and worker["securityContext"]["runAsUser"] == 10001
    assert get(kubectl, "cpl", "orders-score", "-n", ns)["spec"]["mode"] == "inject"


def test_a_stopped_operator_does_not_block_pods(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """The chart's configuration stays, the operator behind it stops (its webhook server
    with it): failurePolicy Ignore admits the pods, unchanged, instead of blocking them."""
    kubectl = control_plane.kubectl
    ns = make_namespace(kubectl, "down")
    ca_pem, webhook = webhook_settings(tmp_path)
    config = OperatorConfig(
        namespaces=(ns,), worker_image="offtake:e2e", lag_source="off", **webhook
    )
    try:
        with webhook_configured(control_plane, ns, config.webhook_port, ca_pem):
            with operator_running(control_plane, config):
                apply(kubectl, ns, inject_pipeline("orders", kafka={"bootstrapServers": "k:9092"}))
                wait_for(lambda: exists(kubectl, "configmap", "orders-pipeline", "-n", ns))
                apply(kubectl, ns, app_pod("before", "orders"))
                assert worker_of(get(kubectl, "pod", "before", "-n", ns)) is not None
            began = time.monotonic()
            apply(kubectl, ns, app_deployment("shop", "orders", replicas=1))
            (pod,) = wait_for(
                lambda: pods_of(kubectl, ns, "shop"), timeout=60, what="the pod, created anyway"
            )
            assert worker_of(pod) is None
            apply(kubectl, ns, app_pod("direct", "orders"))
            assert worker_of(get(kubectl, "pod", "direct", "-n", ns)) is None
            assert time.monotonic() - began < 30
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
