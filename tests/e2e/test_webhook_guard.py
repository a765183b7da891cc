"""Only the API server may call the injection webhook, and only with what it would send.

The chart's default (injection.requireClientCert): it generates a client CA and certificate
into the Secret <operator>-webhook-client and the operator demands a client certificate from
that CA. A control plane of its own whose kube-apiserver presents that certificate to webhooks
(its AdmissionConfiguration's kubeconfig, the certificate and key exported from the rendered
Secret, as docs/operator.md tells the cluster admin), and the operator's webhook (kopf's server
over TLS on loopback, behind GuardedWebhookServer) given the CA file the chart mounts. Through
the API server, a labelled and annotated pod still gets its worker. Called directly (a forged
review): without a client certificate, or with one from another CA, the TLS handshake fails;
with the right one, every request the webhook does not handle (another path, an UPDATE, not a
Pod, not an AdmissionReview, not JSON, oversized) is refused with its reason before kopf sees
it, and hundreds of such requests with fresh uids leave the operator serving.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.inject import (
    install_crd,
    make_namespace,
    webhook_admission_config,
    webhook_configured,
    webhook_settings,
)
from support.kube import consumer_pipeline, get, operator_running, wait_for

from offtake_testbed._pki import CertificateAuthority, KeyPair
from offtake_testbed.kube import ControlPlane, install_control_plane
from offtake_testbed.kube.install import install_helm
from offtake_testbed.pytest_plugin_kube import _kube_version

os.environ.setdefault("OFFTAKE_TICK_SECONDS", "1")

from offtake_operator import names
from offtake_operator.settings import OperatorConfig
from offtake_operator.webhook_guard import MAX_REVIEW_BYTES

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CHART = Path(__file__).resolve().parents[2] / "helm" / "offtake"


def chart_client_certificate() -> tuple[str, KeyPair]:
    """(the client CA, the client certificate and key) the chart generates by default: its
    Secret <operator>-webhook-client as `helm template` renders it, and the CA file the chart
    mounts into the operator is from that Secret (asserted)."""
    rendered = subprocess.run(
        [str(install_helm()), "template", "offtake", str(CHART), "-n", "offtake-system"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    name = "offtake-offtake-operator-webhook-client"
    (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == name]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["OFFTAKE_WEBHOOK_CLIENT_CA_FILE"] == "/etc/offtake/webhook-client-ca/ca.crt"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["webhook-client-ca"]["secret"] == {
        "secretName": "offtake-offtake-operator-webhook-client",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],  # not the client key
    }

    def data(key: str) -> str:
        return base64.b64decode(secret["data"][key]).decode()

    return data("ca.crt"), KeyPair(cert_pem=data("tls.crt"), key_pem=data("tls.key"))


class Setup:
    def __init__(self, cp: ControlPlane, ns: str, port: int, server_ca: str, client: KeyPair):
        self.cp, self.ns, self.port, self.server_ca, self.client = cp, ns, port, server_ca, client


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    folder = tmp_path_factory.mktemp("guard")
    client_ca, client = chart_client_certificate()
    (folder / "client.crt").write_text(client.cert_pem)
    (folder / "client.key").write_text(client.key_pem)
    (folder / "client-ca.crt").write_text(client_ca)
    # The API server presents this certificate to every webhook ("*").
    admission = webhook_admission_config(
        folder,
        "*",
        str(folder / "client.crt"),
        str(folder / "client.key"),
        ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook"),
    )
    cp = ControlPlane(
        install_control_plane(_kube_version()),
        extra_apiserver_args=[f"--admission-control-config-file={admission}"],
    )
    with cp:
        install_crd(cp.kubectl)
        ns = make_namespace(cp.kubectl, "guard")
        server_ca, webhook = webhook_settings(folder)
        config = OperatorConfig(
            namespaces=(ns,),
            worker_image="offtake:e2e",
            lag_source="off",
            webhook_client_ca_file=str(folder / "client-ca.crt"),
            **webhook,
        )
        with (
            operator_running(cp, config),
            webhook_configured(cp, ns, config.webhook_port, server_ca),
        ):
            yield Setup(cp, ns, config.webhook_port, server_ca, client)


def call(
    s: Setup,
    body: bytes,
    *,
    path: str = "/inject-worker",
    client: KeyPair | None = None,
    content_type: str = "application/json",
    tmp: Path,
) -> tuple[int, str]:
    """POST to the webhook directly, as an in-cluster pod would; (status, body)."""
    context = ssl.create_default_context(cadata=s.server_ca)
    if client is not None:
        (tmp / "c.crt").write_text(client.cert_pem)
        (tmp / "c.key").write_text(client.key_pem)
        context.load_cert_chain(tmp / "c.crt", tmp / "c.key")
    request = urllib.request.Request(
        f"https://127.0.0.1:{s.port}{path}",
        data=body,
        headers={"Content-Type": content_type},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def review(operation: str = "CREATE", kind: str = "Pod", labelled: bool = True) -> dict[str, Any]:
    labels = {names.PIPELINE_LABEL: "orders"} if labelled else {}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": operation,
            "namespace": "elsewhere",
            "userInfo": {"username": "mallory"},
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p", "namespace": "elsewhere", "labels": labels},
                "spec": {"containers": [{"name": "app", "image": "x"}]},
            },
        },
    }


def test_the_api_server_still_injects(setup: Setup) -> None:
    kubectl, ns = setup.cp.kubectl, setup.ns
    kubectl("create", "secret", "generic", "kafka", "-n", ns, "--from-literal=sasl.password=x")
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
    kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(pipeline))
    wait_for(lambda: get(kubectl, "configmap", "orders-pipeline", "-n", ns), what="the ConfigMap")

    def pod(name: str, labelled: bool) -> str:
        labels = {names.PIPELINE_LABEL: "orders"} if labelled else {}
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": {names.INJECT_ANNOTATION: "orders"},
                },
                "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]},
            }
        )

    kubectl("apply", "-n", ns, "-f", "-", input=pod("labelled", True))
    got = get(kubectl, "pod", "labelled", "-n", ns)
    assert [c["name"] for c in got["spec"].get("initContainers") or []] == [
        names.INJECTED_CONTAINER
    ]
    # The application keeps its service account token; the injected worker, which never calls
    # the API, gets an empty directory there (the API server then mounts no token into it).
    token_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    (worker,) = got["spec"]["initContainers"]
    (app,) = got["spec"]["containers"]
    volumes = {v["name"]: v for v in got["spec"]["volumes"]}
    app_token = {m["mountPath"]: m["name"] for m in app.get("volumeMounts") or []}[token_dir]
    assert "projected" in volumes[app_token]
    (worker_token,) = [m for m in worker["volumeMounts"] if m["mountPath"] == token_dir]
    assert "emptyDir" in volumes[worker_token["name"]]
    # Without the label the API server does not even call the webhook (objectSelector).
    kubectl("apply", "-n", ns, "-f", "-", input=pod("unlabelled", False))
    assert not get(kubectl, "pod", "unlabelled", "-n", ns)["spec"].get("initContainers")


@pytest.mark.parametrize(
    "client", ["none", "another CA's"], ids=["no-client-cert", "foreign-client-cert"]
)
def test_a_caller_without_the_api_servers_certificate_is_refused(
    setup: Setup, client: str, tmp_path: Path
) -> None:
    pair = None if client == "none" else CertificateAuthority("mallory").client("mallory")
    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
        call(setup, json.dumps(review()).encode(), client=pair, tmp=tmp_path)


def test_what_the_webhook_does_not_handle_is_refused_before_kopf(
    setup: Setup, tmp_path: Path
) -> None:
    me = setup.client

    def status(body: Any, **kw: Any) -> tuple[int, str]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return call(setup, raw, client=me, tmp=tmp_path, **kw)

    assert status(review(), path="/other")[0] == 404
    code, why = status(review(operation="UPDATE"))
    assert code == 400 and "request.operation" in why
    code, why = status(review(kind="Secret"))
    assert code == 400 and "request.kind" in why
    code, why = status({"kind": "Pod"})
    assert code == 400 and "AdmissionReview" in why
    assert status(b"{not json")[0] == 400
    assert status(review(), content_type="text/plain")[0] == 415
    assert status(b"x" * (MAX_REVIEW_BYTES + 1))[0] == 413
    # kopf keeps a memo per uid for every non-CREATE review it handles: hundreds with fresh
    # uids are refused before it, and a real review is still answered.
    for _ in range(300):
        assert status(review(operation="DELETE"))[0] == 400
    code, answer = status(review(labelled=False))
    assert code == 200 and json.loads(answer)["response"]["allowed"] is True
