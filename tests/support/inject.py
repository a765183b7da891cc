"""Helpers for the inject-mode tests (tests/e2e/test_operator_inject.py, tests/node)."""

from __future__ import annotations

import base64
import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from offtake_operator.context import OperatorContext
from offtake_operator.settings import OperatorConfig
from offtake_testbed._pki import CertificateAuthority
from offtake_testbed.kube import ControlPlane
from offtake_testbed.process import free_port
from offtake_testbed.pytest_plugin_kube import Kubectl
from support.kube import get, operator_running, wait_for

CHART = Path(__file__).resolve().parents[2] / "helm" / "offtake"


def make_namespace(kubectl: Kubectl, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    return name


def webhook_configuration(
    control_plane: ControlPlane, release: str, url: str, ca_pem: str, namespaces: list[str]
) -> dict[str, Any]:
    """The chart's MutatingWebhookConfiguration, rendered by helm for these values."""
    args = [
        "template",
        release,
        str(CHART),
        "--kube-version",
        "1.34.0",
        "--show-only",
        "templates/injection.yaml",
        "--set",
        f"injection.url={url}",
        "--set",
        "injection.certSecret=unused",
        "--set",
        f"injection.caBundle={base64.b64encode(ca_pem.encode()).decode()}",
        "--set-json",
        f"operator.namespaces={json.dumps(namespaces)}",
    ]
    out = control_plane.helm(*args).stdout
    (mwc,) = [
        d for d in yaml.safe_load_all(out) if d and d["kind"] == "MutatingWebhookConfiguration"
    ]
    return dict(mwc)


def install_crd(kubectl: Kubectl) -> None:
    """Apply the ConsumerPipeline CRD and wait until it is served (an operator started before
    that would not watch pipelines)."""
    kubectl("apply", "-f", str(CHART.parents[1] / "crds" / "consumerpipeline.yaml"))

    # Not `kubectl wait --for=condition=Established`: right after the apply the CRD may have no
    # status.conditions yet, and kubectl then fails instead of waiting.
    def established() -> bool:
        crd = get(kubectl, "crd", "consumerpipelines.offtake.dev")
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for(established, timeout=60, what="the ConsumerPipeline CRD established")


def webhook_settings(folder: Path) -> tuple[str, dict[str, Any]]:
    """(CA certificate, OperatorConfig settings) of a webhook served on a free loopback port
    with a serving certificate for 127.0.0.1 written to ``folder``."""
    ca = CertificateAuthority("offtake-webhook-test-ca")
    pair = ca.server("offtake-webhook", hosts=("127.0.0.1",))
    (folder / "tls.crt").write_text(pair.cert_pem)
    (folder / "tls.key").write_text(pair.key_pem)
    return ca.cert_pem, {
        "webhook_port": free_port(),
        "webhook_address": "127.0.0.1",
        "webhook_cert_file": str(folder / "tls.crt"),
        "webhook_key_file": str(folder / "tls.key"),
    }


def webhook_admission_config(
    folder: Path, user: str, cert: str, key: str, plugins: tuple[str, ...]
) -> Path:
    """The API server's admission configuration for webhooks, written into ``folder``: the
    client certificate ``cert``/``key`` (file paths) it presents to the webhooks that
    kubeconfig user ``user`` names ("*": every webhook; a service's DNS name: that one), for
    the admission ``plugins`` (MutatingAdmissionWebhook, ValidatingAdmissionWebhook). Returns
    the file for --admission-control-config-file."""
    kubeconfig = folder / "webhook-kubeconfig.yaml"
    credentials = {"client-certificate": cert, "client-key": key}
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "users": [{"name": user, "user": credentials}],
            }
        )
    )
    webhook_admission = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(kubeconfig),
    }
    admission = folder / "admission.yaml"
    admission.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "AdmissionConfiguration",
                "plugins": [{"name": p, "configuration": webhook_admission} for p in plugins],
            }
        )
    )
    return admission


@contextlib.contextmanager
def webhook_configured(
    control_plane: ControlPlane, namespace: str, port: int, ca_pem: str
) -> Iterator[dict[str, Any]]:
    """The chart's webhook configuration for ``namespace``, pointing the API server at
    https://127.0.0.1:``port``, applied for the duration of the block."""
    release = f"inj{uuid.uuid4().hex[:6]}"
    url = f"https://127.0.0.1:{port}"
    mwc = webhook_configuration(control_plane, release, url, ca_pem, [namespace])
    kubectl = control_plane.kubectl
    kubectl("apply", "-f", "-", input=yaml.safe_dump(mwc))
    try:
        yield mwc
    finally:
        kubectl("delete", "mutatingwebhookconfiguration", mwc["metadata"]["name"], check=False)


@contextlib.contextmanager
def operator_with_webhook(
    control_plane: ControlPlane, namespace: str, folder: Path, **settings: Any
) -> Iterator[OperatorContext]:
    """The operator (in this process) serving ``namespace`` and its injection webhook over TLS
    on loopback, with the chart's webhook configuration pointing the API server at it."""
    ca_pem, webhook = webhook_settings(folder)
    config = OperatorConfig(namespaces=(namespace,), **webhook, **settings)
    with (
        operator_running(control_plane, config) as ctx,
        webhook_configured(control_plane, namespace, config.webhook_port, ca_pem),
    ):
        yield ctx
