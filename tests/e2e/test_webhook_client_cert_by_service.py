"""The API server's client certificate for the injection webhook, found by the webhook's
Service name: the kubeconfig user ``<service>.<namespace>.svc`` of docs/operator.md ("Who may
call the webhook"), the way a cluster admin sets it up for the chart's default install (a
``service`` reference on port 443, the chart's own serving and client certificates).

A control plane of its own whose AdmissionConfiguration's kubeconfig has that one user and no
``"*"``; the chart's Service, MutatingWebhookConfiguration and certificates as ``helm
template`` renders them; the operator's webhook (kopf's server behind GuardedWebhookServer)
on this machine's non-loopback address (an EndpointSlice may not point at loopback; the API
server routes to a Service's endpoints, --enable-aggregator-routing) with the chart's client
CA. Through the API server a labelled pod gets its worker: the certificate was presented.
The same Service on port 8443 (user name ``<service>.<namespace>.svc:8443``, which the
kubeconfig lacks) is the control: the API server presents no certificate there, its call
fails at TLS (its log says so), and failurePolicy Ignore lets that pod start without a worker.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.inject import install_crd, webhook_admission_config
from support.kube import consumer_pipeline, get, operator_running, wait_for

from offtake_testbed.kube import ControlPlane, install_control_plane
from offtake_testbed.kube.install import install_helm
from offtake_testbed.process import free_port
from offtake_testbed.pytest_plugin_kube import _kube_version

os.environ.setdefault("OFFTAKE_TICK_SECONDS", "1")

from offtake_operator import names
from offtake_operator.settings import OperatorConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CHART = Path(__file__).resolve().parents[2] / "helm" / "offtake"
RELEASE_NS = "offtake-system"
SERVICE = "offtake-offtake-operator-webhook"  # the chart's, for release "offtake"
# The kubeconfig user the API server looks up for a service reference on port 443.
USER = f"{SERVICE}.{RELEASE_NS}.svc"
DECOY_PORT = 8443


def host_address() -> str:
    """This machine's address on its default route (no packet is sent): the webhook's
    endpoint, which may not be loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
        except OSError as exc:
            pytest.fail(f"no non-loopback IPv4 address for the webhook's endpoint: {exc}")
        address = str(s.getsockname()[0])
    if address.startswith("127."):
        pytest.fail("no non-loopback IPv4 address for the webhook's endpoint")
    return address


def render(namespaces: list[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """The chart's injection objects (defaults: a service reference, generated serving and
    client certificates), by (kind, name)."""
    out = subprocess.run(
        [str(install_helm()), "template", "offtake", str(CHART), "-n", RELEASE_NS,
         "--show-only", "templates/injection.yaml",
         "--set-json", f"operator.namespaces={json.dumps(namespaces)}"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(out) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def secret_file(secret: dict[str, Any], key: str, path: Path) -> str:
    path.write_bytes(base64.b64decode(secret["data"][key]))
    return str(path)


class Setup:
    def __init__(self, cp: ControlPlane, served: str, decoy: str) -> None:
        self.cp, self.served, self.decoy = cp, served, decoy


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    folder = tmp_path_factory.mktemp("svc-identity")
    served, decoy = f"svcid-{uuid.uuid4().hex[:6]}", f"decoy-{uuid.uuid4().hex[:6]}"
    objects = render([served])
    tls = objects[("Secret", f"{SERVICE}-tls")]
    client = objects[("Secret", f"{SERVICE}-client")]
    service = objects[("Service", SERVICE)]
    (mwc,) = [o for (kind, _), o in objects.items() if kind == "MutatingWebhookConfiguration"]
    assert mwc["webhooks"][0]["clientConfig"]["service"] == {
        "name": SERVICE, "namespace": RELEASE_NS, "path": "/inject-worker", "port": 443,
    }  # fmt: skip
    # The user is only this service reference, no "*": only it gets the certificate.
    admission = webhook_admission_config(
        folder,
        USER,
        secret_file(client, "tls.crt", folder / "client.crt"),
        secret_file(client, "tls.key", folder / "client.key"),
        ("MutatingAdmissionWebhook",),
    )
    address, port = host_address(), free_port()
    # The control: the same webhook behind the same Service on another port, for the other
    # namespace's pods.
    service["spec"]["ports"].append(
        {"name": "decoy", "port": DECOY_PORT, "targetPort": "webhook", "protocol": "TCP"}
    )
    decoy_mwc = copy.deepcopy(mwc)
    decoy_mwc["metadata"]["name"] = "offtake-decoy"
    hook = decoy_mwc["webhooks"][0]
    hook["name"] = "decoy.offtake.dev"
    hook["clientConfig"]["service"]["port"] = DECOY_PORT
    hook["namespaceSelector"] = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [decoy]}
        ]
    }
    endpoints = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{SERVICE}-here",
            "namespace": RELEASE_NS,
            "labels": {
                "kubernetes.io/service-name": SERVICE,
                "endpointslice.kubernetes.io/managed-by": "offtake-e2e",
            },
        },
        "addressType": "IPv4",
        "ports": [
            {"name": "webhook", "port": port, "protocol": "TCP"},
            {"name": "decoy", "port": port, "protocol": "TCP"},
        ],
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
    }
    cp = ControlPlane(
        install_control_plane(_kube_version()),
        extra_apiserver_args=[f"--admission-control-config-file={admission}"],
    )
    with cp:
        install_crd(cp.kubectl)
        for ns in (RELEASE_NS, served, decoy):
            cp.kubectl("create", "namespace", ns)
        cp.apply([service, endpoints, mwc, decoy_mwc])
        config = OperatorConfig(
            namespaces=(served, decoy),
            worker_image="offtake:e2e",
            lag_source="off",
            webhook_port=port,
            webhook_address=address,
            webhook_cert_file=secret_file(tls, "tls.crt", folder / "tls.crt"),
            webhook_key_file=secret_file(tls, "tls.key", folder / "tls.key"),
            webhook_client_ca_file=secret_file(client, "ca.crt", folder / "client-ca.crt"),
        )
        with operator_running(cp, config):
            for ns in (served, decoy):
                pipeline_in(cp, ns)
            yield Setup(cp, served, decoy)


def pipeline_in(cp: ControlPlane, ns: str) -> None:
    cp.kubectl("create", "secret", "generic", "kafka", "-n", ns, "--from-literal=sasl.password=x")
    pipeline = consumer_pipeline(
        "orders",
        {
            "mode": "inject",
            "kafka": {"bootstrapServers": "kafka:9092", "secretRef": {"name": "kafka"}},
            "source": {"topics": ["orders"]},
            "processor": {"container": {"port": 8080}},
            "sink": {"log": {}},
        },
    )
    cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(pipeline))
    wait_for(
        lambda: get(cp.kubectl, "configmap", "orders-pipeline", "-n", ns), what="the ConfigMap"
    )


def new_pod(cp: ControlPlane, ns: str) -> list[str]:
    """Create a labelled, annotated pod; the names of its init containers (the worker's, if
    the webhook injected it)."""
    name = f"app-{uuid.uuid4().hex[:6]}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {names.PIPELINE_LABEL: "orders"},
            "annotations": {names.INJECT_ANNOTATION: "orders"},
        },
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]},
    }
    cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(pod))
    got = get(cp.kubectl, "pod", name, "-n", ns)
    return [c["name"] for c in got["spec"].get("initContainers") or []]


def test_the_api_server_presents_the_certificate_its_kubeconfig_names_for_the_service(
    setup: Setup,
) -> None:
    cp = setup.cp
    # The API server learns the Service, its endpoints and the webhook configuration from
    # watches: until it has, a pod starts without its worker (failurePolicy Ignore); so new
    # pods are made until one is injected (each is a complete, independent admission).
    wait_for(
        lambda: new_pod(cp, setup.served) == [names.INJECTED_CONTAINER],
        timeout=120,
        what="a pod injected through the Service, the API server presenting the certificate",
        explain=lambda: cp.log_tail("kube-apiserver"),
    )

    # The control: no kubeconfig user for <service>.<namespace>.svc:8443, so no certificate,
    # and the webhook refuses the handshake. Wait for the API server's own account of it.
    failed_open = re.compile(r"Failed calling webhook, failing open decoy\.offtake\.dev: (.*)")

    def decoy_refused() -> str | None:
        assert new_pod(cp, setup.decoy) == [], "injected without the client certificate"
        found = failed_open.findall(cp.log_file("kube-apiserver").read_text(errors="replace"))
        return found[-1] if found else None

    why = wait_for(decoy_refused, timeout=120, what="the decoy call failing open")
    assert re.search(r"(?i)certificate required|bad certificate|handshake|: EOF", why), why
    assert f"{SERVICE}.{RELEASE_NS}.svc:{DECOY_PORT}" in why, why
