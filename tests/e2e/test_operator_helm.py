"""The Helm chart on a real control plane, and two operator replicas with the chart's RBAC.

The chart's operator Deployment cannot run here (no kubelet), so the test runs two
``offtake-operator`` processes itself, authenticated as the chart's ServiceAccount (a token from
the TokenRequest API): if the ClusterRole misses a permission, they fail. With kopf peering, the
higher priority works and the other stands by until the first one stops renewing its record.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.kube import exists, get, wait_for

from offtake_testbed.kube import KUBE_VERSION, ControlPlane
from offtake_testbed.pytest_plugin_kube import Helm, Kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "offtake"
# helm template checks the chart's kubeVersion against a built-in version when offline (v1.20
# for a helm built with `go install`): name the control plane's.
OFFLINE = ("--kube-version", KUBE_VERSION)


def grants(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    return {
        (g, r): set(rule["verbs"])
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }


def test_chart_renders_the_operator_with_least_privilege(
    control_plane: ControlPlane, helm: Helm
) -> None:
    out = helm(
        "template",
        "offtake",
        str(CHART),
        "-n",
        "offtake-system",
        "--set",
        "operator.replicas=2",
        *OFFLINE,
    ).stdout
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}
    dep = docs["Deployment", "offtake-offtake-operator"]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["offtake-operator"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["OFFTAKE_PEERING"] == "offtake"
    # Three images, the Dockerfile's three targets, one tag (the chart's appVersion).
    assert container["image"] == "ghcr.io/offtake/offtake-operator:0.1.0"
    assert env["OFFTAKE_WORKER_IMAGE"] == "ghcr.io/offtake/offtake-worker:0.1.0"
    assert env["OFFTAKE_WORKER_SPARK_IMAGE"] == "ghcr.io/offtake/offtake-worker-spark:0.1.0"
    assert ("ClusterKopfPeering", "offtake") in docs
    granted = grants(docs["ClusterRole", "offtake-offtake-operator-cluster"]["rules"])
    # Secrets: read, plus writing the Spark Connect token Secret the operator generates (never
    # list or watch: it reads only the Secrets a pipeline names).
    assert granted["", "secrets"] == {"get", "create", "patch", "delete"}
    # Pods: read only (mode inject's status and orphan report); the webhook patches them
    # through admission, which needs no grant.
    assert granted["", "pods"] == {"get", "list", "watch"}
    webhook = docs["MutatingWebhookConfiguration", "offtake-offtake-inject"]["webhooks"][0]
    assert webhook["failurePolicy"] == "Ignore" and webhook["sideEffects"] == "None"
    assert webhook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "operations": ["CREATE"],
            "scope": "Namespaced",
        }
    ]
    assert webhook["namespaceSelector"]["matchExpressions"] == [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", "kube-node-lease", "offtake-system"],
        }
    ]
    assert webhook["clientConfig"]["service"] == {
        "name": "offtake-offtake-operator-webhook",
        "namespace": "offtake-system",
        "path": "/inject-worker",
        "port": 443,
    }
    tls = docs["Secret", "offtake-offtake-operator-webhook-tls"]["data"]
    assert webhook["clientConfig"]["caBundle"] == tls["ca.crt"]
    assert env["OFFTAKE_WEBHOOK_PORT"] == "9443"
    assert env["OFFTAKE_WEBHOOK_CERT_FILE"] == "/etc/offtake/webhook/tls.crt"
    # The switch: no webhook, no certificate, no webhook server.
    out = helm(
        "template", "offtake", str(CHART), "--set", "injection.enabled=false", *OFFLINE
    ).stdout
    off = [d for d in yaml.safe_load_all(out) if d]
    assert not [
        d for d in off if "webhook" in d["metadata"]["name"] or "inject" in d["metadata"]["name"]
    ]
    (dep_off,) = [d for d in off if d["kind"] == "Deployment"]
    env_off = {e["name"] for e in dep_off["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "OFFTAKE_WEBHOOK_PORT" not in env_off
    assert "delete" not in granted["offtake.dev", "consumerpipelines"]
    # Nothing the operator does not do: no PUT (apply and kopf patch), ConfigMaps and Services
    # never deleted (the garbage collector does), optional children never listed.
    assert not [
        (k, v)
        for k, v in granted.items()
        if "update" in v and k[1] != ("consumerpipelines/finalizers")
    ]
    assert granted["", "configmaps"] == {"get", "list", "watch", "create", "patch"}
    assert granted["", "events"] == {"create"}
    assert granted["autoscaling", "horizontalpodautoscalers"] == {
        "get",
        "create",
        "patch",
        "delete",
    }


def test_a_chart_serving_namespaces_grants_roles_there_and_only_cluster_reads_cluster_wide(
    helm: Helm,
) -> None:
    out = helm(
        "template",
        "offtake",
        str(CHART),
        "-n",
        "offtake-system",
        "--set",
        "operator.namespaces={shop,billing}",
        "--set",
        "operator.replicas=2",
        *OFFLINE,
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    rbac = {(d["kind"], d["metadata"].get("namespace")): d for d in docs if "Role" in d["kind"]}
    assert set(rbac) == {
        ("ClusterRole", None),
        ("ClusterRoleBinding", None),
        ("Role", "shop"),
        ("RoleBinding", "shop"),
        ("Role", "billing"),
        ("RoleBinding", "billing"),
    }
    # The ClusterRole: exactly the cluster-scoped reads kopf needs, nothing namespaced.
    assert grants(rbac["ClusterRole", None]["rules"]) == {
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
        ("", "namespaces"): {"get", "list", "watch"},
    }
    for ns in ("shop", "billing"):
        role = grants(rbac["Role", ns]["rules"])
        assert role["apps", "deployments"] == {"get", "list", "watch", "create", "patch", "delete"}
        assert role["", "secrets"] == {"get", "create", "patch", "delete"}
        assert role["kopf.dev", "kopfpeerings"] == {"get", "list", "watch", "patch"}
        binding = rbac["RoleBinding", ns]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "offtake-offtake-operator",
        }
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": "offtake-offtake-operator",
                "namespace": "offtake-system",
            }
        ]
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    env = {
        e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["OFFTAKE_NAMESPACES"] == "shop,billing"
    # The peering record is per namespace, like the grant.
    peerings = {(d["kind"], d["metadata"].get("namespace")) for d in docs if "Peering" in d["kind"]}
    assert peerings == {("KopfPeering", "shop"), ("KopfPeering", "billing")}


def sa_kubeconfig(
    control_plane: ControlPlane, kubectl: Kubectl, namespace: str, sa: str, path: Path
) -> Path:
    token = kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    ca = base64.b64encode(control_plane.ca_file.read_bytes()).decode()
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "sa",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": control_plane.server,
                            "certificate-authority-data": ca,
                        },
                    }
                ],
                "users": [{"name": sa, "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": "c", "user": sa}}],
            }
        )
    )
    return path


class OperatorProcess:
    def __init__(self, kubeconfig: Path, priority: int, log: Path, *, namespaces: str = "") -> None:
        env = {
            **os.environ,
            "OFFTAKE_NAMESPACES": namespaces,
            "KUBECONFIG": str(kubeconfig),
            "OFFTAKE_PEERING": "offtake",
            "OFFTAKE_PEERING_PRIORITY": str(priority),
            "OFFTAKE_PEERING_LIFETIME_SECONDS": "10",
            "OFFTAKE_LAG_SOURCE": "off",
            "OFFTAKE_LIVENESS_ENDPOINT": "",
            "OFFTAKE_TICK_SECONDS": "1",
            "PYTHONUNBUFFERED": "1",  # the test reads the log while the process runs
        }
        self.log = log
        self.proc = subprocess.Popen(
            ["offtake-operator", "--verbose"],
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def handled(self, name: str) -> bool:
        """Whether this process ran a change handler for the pipeline ``name``."""
        return any(
            "pipeline_changed" in line and "succeeded" in line and f"/{name}]" in line
            for line in self.text().splitlines()
        )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def release(helm: Helm, kubectl: Kubectl) -> Iterator[str]:
    namespace = f"offtake-{uuid.uuid4().hex[:6]}"
    helm(
        "install",
        "offtake",
        str(CHART),
        "-n",
        namespace,
        "--create-namespace",
        "--set",
        "operator.replicas=2",
        "--set",
        "peering.lifetimeSeconds=10",
        "--wait=false",
    )
    try:
        yield namespace
    finally:
        helm("uninstall", "offtake", "-n", namespace, check=False)
        kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_two_peered_operators_with_the_charts_rbac(
    control_plane: ControlPlane, kubectl: Kubectl, release: str, kube_namespace: str, tmp_path: Path
) -> None:
    sa = "offtake-offtake-operator"
    assert get(kubectl, "crd", "consumerpipelines.offtake.dev")["spec"]["names"]["shortNames"] == [
        "cpl"
    ]
    assert get(kubectl, "clusterkopfpeering", "offtake")["metadata"]["name"] == "offtake"
    who = f"system:serviceaccount:{release}:{sa}"
    for verb, what, allowed in [
        ("create", "deployments.apps", "yes"),
        ("patch", "consumerpipelines.offtake.dev/status", "yes"),
        ("get", "secrets", "yes"),
        ("list", "secrets", "no"),
        ("create", "pods", "no"),
        ("delete", "consumerpipelines.offtake.dev", "no"),
    ]:
        answer = kubectl(
            "auth", "can-i", verb, what, "--as", who, "-n", kube_namespace, check=False
        ).stdout.strip()
        assert answer == allowed, f"{verb} {what}: {answer}"

    kubeconfig = sa_kubeconfig(control_plane, kubectl, release, sa, tmp_path / "sa-kubeconfig")
    high = OperatorProcess(kubeconfig, 20, tmp_path / "high.log")
    # The standby must find the active replica in the peering record when it starts: started
    # together, the low one could read an empty record first and go active itself (a race of
    # the test, not of the product: a standby that sees no peer is right to act).
    wait_for(
        lambda: any(
            (peer or {}).get("priority") == 20
            for peer in (get(kubectl, "clusterkopfpeering", "offtake").get("status") or {}).values()
        ),
        what="the high-priority replica in the peering record",
    )
    low = OperatorProcess(kubeconfig, 10, tmp_path / "low.log")
    try:
        # The standby starts paused: its watches wait behind the peering blocker.
        wait_for(
            lambda: "Pausing the watch-stream for consumerpipelines" in low.text(),
            what="the low-priority replica standing by",
        )
        manifest = {
            "apiVersion": "offtake.dev/v1alpha1",
            "kind": "ConsumerPipeline",
            "metadata": {"name": "peered"},
            "spec": {
                "kafka": {"bootstrapServers": "kafka:9092"},
                "source": {"topics": ["t"]},
                "sink": {"log": {}},
            },
        }
        kubectl("apply", "-n", kube_namespace, "-f", "-", input=yaml.safe_dump(manifest))
        wait_for(
            lambda: get(kubectl, "deployment", "peered", "-n", kube_namespace),
            what="the Deployment",
        )
        wait_for(
            lambda: (get(kubectl, "cpl", "peered", "-n", kube_namespace).get("status") or {}).get(
                "phase"
            ),
            what="status written with the chart's RBAC",
        )
        wait_for(lambda: high.handled("peered"), what="the high-priority replica handling it")
        assert not low.handled("peered"), "the standby replica must not act"

        high.stop(signal.SIGKILL)  # no goodbye: the standby notices when the record expires
        kubectl("scale", "cpl/peered", "--replicas=3", "-n", kube_namespace)
        wait_for(
            lambda: (
                get(kubectl, "deployment", "peered", "-n", kube_namespace)["spec"]["replicas"] == 3
            ),
            timeout=90,
            what="the standby taking over",
        )
        assert "Resuming operations" in low.text()
        for proc in (high, low):
            # RBAC denials name the user: "... is forbidden: User "system:serviceaccount:..."
            denied = [line for line in proc.text().splitlines() if f'User "{who}" cannot' in line]
            assert not denied, denied[:3]
    finally:
        high.stop()
        low.stop()


def test_an_operator_serving_one_namespace_runs_on_the_charts_roles_alone(
    control_plane: ControlPlane, helm: Helm, kubectl: Kubectl, kube_namespace: str, tmp_path: Path
) -> None:
    """operator.namespaces on the real API server: the Role in the served namespace is all the
    operator needs (reconcile, status, Events, its KopfPeering), and it reaches nothing
    namespaced anywhere else."""
    home = f"offtake-{uuid.uuid4().hex[:6]}"
    sets = [f"operator.namespaces={{{kube_namespace}}}", "operator.replicas=2"]
    sets += ["injection.enabled=false"]  # no webhook configuration left for other tests
    args = [arg for value in sets for arg in ("--set", value)]
    helm("install", "scoped", str(CHART), "-n", home, "--create-namespace", *args, "--wait=false")
    proc = None
    try:
        sa = "scoped-offtake-operator"
        who = f"system:serviceaccount:{home}:{sa}"
        for verb, what, where, allowed in [
            ("create", "deployments.apps", kube_namespace, "yes"),
            ("patch", "consumerpipelines.offtake.dev/status", kube_namespace, "yes"),
            ("get", "secrets", kube_namespace, "yes"),
            ("list", "secrets", kube_namespace, "no"),
            ("delete", "configmaps", kube_namespace, "no"),
            ("create", "deployments.apps", home, "no"),
            ("get", "secrets", "default", "no"),
            ("patch", "consumerpipelines.offtake.dev", "default", "no"),
            ("patch", "kopfpeerings.kopf.dev", "default", "no"),
        ]:
            answer = kubectl(
                "auth", "can-i", verb, what, "--as", who, "-n", where, check=False
            ).stdout.strip()
            assert answer == allowed, f"{verb} {what} in {where}: {answer}"
        kubeconfig = sa_kubeconfig(control_plane, kubectl, home, sa, tmp_path / "kubeconfig")
        proc = OperatorProcess(kubeconfig, 10, tmp_path / "op.log", namespaces=kube_namespace)
        manifest = {
            "apiVersion": "offtake.dev/v1alpha1",
            "kind": "ConsumerPipeline",
            "metadata": {"name": "scoped"},
            "spec": {
                "kafka": {"bootstrapServers": "kafka:9092"},
                "source": {"topics": ["t"]},
                "sink": {"log": {}},
            },
        }
        kubectl("apply", "-n", kube_namespace, "-f", "-", input=yaml.safe_dump(manifest))
        wait_for(
            lambda: exists(kubectl, "deployment", "scoped", "-n", kube_namespace),
            what="the Deployment",
        )
        wait_for(
            lambda: (get(kubectl, "cpl", "scoped", "-n", kube_namespace).get("status") or {}).get(
                "phase"
            ),
            what="status written with the Role alone",
        )
        kubectl("delete", "cpl", "scoped", "-n", kube_namespace, "--timeout=60s")
        denied = [line for line in proc.text().splitlines() if f'User "{who}" cannot' in line]
        assert not denied, denied[:3]
    finally:
        if proc is not None:
            proc.stop()
        helm("uninstall", "scoped", "-n", home, check=False)
        kubectl("delete", "namespace", home, "--wait=false", check=False)


BAD_VALUES = [
    (["--set", "operator.replicas=abc"], "/operator/replicas", "want integer"),
    (["--set", "operator.namespaces=shop"], "/operator/namespaces", "want array"),
    (["--set", "operator.lagSource=prometheus"], "/operator/lagSource", "must be one of"),
    (["--set", "operatr.replicas=2"], "'operatr'", "not allowed"),
    (
        ["--set", "monitoring.serviceMonitor.labels.release=1"],
        "/monitoring/serviceMonitor/labels/release",
        "want string",
    ),
]


@pytest.mark.parametrize(
    ("values", "worker", "spark"),
    [
        ([], "ghcr.io/offtake/offtake-worker:1.2.3", "ghcr.io/offtake/offtake-worker-spark:1.2.3"),
        # One image of the user's own serves every pipeline, Spark ones included.
        (["worker.image=mine:1"], "mine:1", "mine:1"),
        (["worker.image=mine:1", "worker.sparkImage=mine-spark:1"], "mine:1", "mine-spark:1"),
        (
            ["worker.repository=reg/w", "worker.sparkRepository=reg/ws"],
            "reg/w:1.2.3",
            "reg/ws:1.2.3",
        ),
    ],
)
def test_chart_passes_the_worker_images_to_the_operator(
    helm: Helm, values: list[str], worker: str, spark: str
) -> None:
    sets = [arg for value in ["image.tag=1.2.3", *values] for arg in ("--set", value)]
    out = helm("template", "offtake", str(CHART), *sets, *OFFLINE).stdout
    [dep] = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment"]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert container["image"] == "ghcr.io/offtake/offtake-operator:1.2.3"
    assert (env["OFFTAKE_WORKER_IMAGE"], env["OFFTAKE_WORKER_SPARK_IMAGE"]) == (worker, spark)


@pytest.mark.parametrize(("args", "field", "problem"), BAD_VALUES, ids=[a[1] for a in BAD_VALUES])
def test_bad_values_fail_at_template_and_lint_naming_the_value(
    helm: Helm, args: list[str], field: str, problem: str
) -> None:
    for command in (["template", "offtake", str(CHART), *OFFLINE], ["lint", str(CHART)]):
        result = helm(*command, *args, check=False)
        assert result.returncode != 0, f"helm {command[0]} {args} succeeded"
        out = result.stderr + result.stdout
        assert "values don't meet the specifications of the schema" in out, out
        assert field in out and problem in out, out


def test_chart_installs_upgrades_and_uninstalls_with_non_default_values(
    helm: Helm, kubectl: Kubectl, kube_namespace: str
) -> None:
    ns = kube_namespace
    helm("lint", str(CHART))
    helm(
        "install", "prod", str(CHART), "-n", ns,
        "--set", "fullnameOverride=ot",
        "--set", f"operator.namespaces={{{ns}}}",
        "--set", "monitoring.release=kube-prometheus-stack",
        "--set", "monitoring.serviceMonitor.labels.team=data",
        "--wait=false",
    )  # fmt: skip
    dep = get(kubectl, "deployment", "ot-operator", "-n", ns)
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert yaml.safe_load(env["OFFTAKE_SERVICE_MONITOR_LABELS"]) == {
        "release": "kube-prometheus-stack",
        "team": "data",
    }
    assert env["OFFTAKE_NAMESPACES"] == ns
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert exists(kubectl, "role", "ot-operator", "-n", ns)
    # One replica: no PodDisruptionBudget (it would block every drain of the node).
    assert not exists(kubectl, "poddisruptionbudget", "ot-operator", "-n", ns)
    assert container["readinessProbe"]["httpGet"] == {
        "path": "/healthz",
        "port": "health",
        "scheme": "HTTP",
    }
    tls = get(kubectl, "secret", "ot-operator-webhook-tls", "-n", ns)["data"]
    client = get(kubectl, "secret", "ot-operator-webhook-client", "-n", ns)["data"]
    helm(
        "upgrade", "prod", str(CHART), "-n", ns, "--reuse-values",
        "--set", "operator.replicas=2", "--wait=false",
    )  # fmt: skip
    wait_for(
        lambda: get(kubectl, "deployment", "ot-operator", "-n", ns)["spec"]["replicas"] == 2,
        what="2 replicas after the upgrade",
    )
    # Two replicas: the API server took the PDB and the anti-affinity, and the disruption
    # controller finds the operator's two pods with the PDB's selector.
    wait_for(
        lambda: (
            get(kubectl, "poddisruptionbudget", "ot-operator", "-n", ns)
            .get("status", {})
            .get("expectedPods")
            == 2
        ),
        what="the operator PDB counting both operator pods",
    )
    affinity = get(kubectl, "deployment", "ot-operator", "-n", ns)["spec"]["template"]["spec"][
        "affinity"
    ]
    assert "preferredDuringSchedulingIgnoredDuringExecution" in affinity["podAntiAffinity"]
    # The webhook's certificate survives the upgrade (read back with lookup), and the
    # configuration keeps trusting it.
    assert get(kubectl, "secret", "ot-operator-webhook-tls", "-n", ns)["data"] == tls
    mwc = get(kubectl, "mutatingwebhookconfiguration", "ot-inject")
    assert mwc["webhooks"][0]["clientConfig"]["caBundle"] == tls["ca.crt"]
    # So does the client certificate the cluster admin exported into the API server's
    # kubeconfig (injection.requireClientCert, the default).
    assert get(kubectl, "secret", "ot-operator-webhook-client", "-n", ns)["data"] == client
    notes = helm("get", "notes", "prod", "-n", ns).stdout
    assert "kind: ConsumerPipeline" in notes and "kubectl apply --server-side" in notes
    # The installer is told that injection waits for the API server's client certificate.
    assert "Secret ot-operator-webhook-client" in notes
    helm("uninstall", "prod", "-n", ns)
    wait_for(lambda: not exists(kubectl, "deployment", "ot-operator", "-n", ns), what="gone")
    assert not exists(kubectl, "poddisruptionbudget", "ot-operator", "-n", ns)
    assert not exists(kubectl, "mutatingwebhookconfiguration", "ot-inject")
    # Helm keeps what it installed from crds/: the pipelines survive an uninstall.
    assert exists(kubectl, "crd", "consumerpipelines.offtake.dev")
