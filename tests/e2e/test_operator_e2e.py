"""The operator on a real control plane: kube-apiserver, etcd and kube-controller-manager.

The operator runs in this process (``offtake_operator.embedded``) against the test bed's
kubeconfig. Nothing runs containers here, so the full-loop test plays kubelet itself: it starts
worker processes from the Deployment's pod template against the real Kafka broker, reports
their readiness on the Pod objects, and stops them when the ReplicaSet deletes their pods.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, Producer
from support.kube import (
    consumer_pipeline,
    exists,
    get,
    operator_running,
    patch,
    wait_for,
    wait_for_passes,
)
from support.workers import served_port

from offtake.config import load_pipeline
from offtake_testbed.kafka import SCRAM_TLS_LISTENER, KafkaBroker
from offtake_testbed.kube import ControlPlane
from offtake_testbed.process import free_port
from offtake_testbed.pytest_plugin import SCRAM_USER, TopicFactory
from offtake_testbed.pytest_plugin_kube import Kubectl

# Read when the handlers module is first imported: a one-second tick keeps the tests brisk.
os.environ.setdefault("OFFTAKE_TICK_SECONDS", "1")

from offtake_operator import names
from offtake_operator.context import OperatorContext
from offtake_operator.render.worker_network_policy import policy_name
from offtake_operator.settings import OperatorConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "consumerpipeline.yaml"
# The examples that render a Deployment (mode inject's example runs in test_operator_inject).
EXAMPLES = [
    p
    for p in sorted((ROOT / "examples").glob("*.yaml"))
    if yaml.safe_load(p.read_text())["spec"].get("mode") != "inject"
]
COLUMNS = [
    "NAME", "PHASE", "READY", "REPLICAS", "GROUP", "LAG", "LAG(S)", "REASON", "MESSAGE", "AGE",
]  # fmt: skip


def pipeline(name: str, **spec: Any) -> dict[str, Any]:
    defaults = {
        "kafka": {"bootstrapServers": "kafka:9092"},
        "source": {"topics": ["orders"]},
        "sink": {"log": {}},
    }
    return consumer_pipeline(name, {**defaults, **spec})


def apply(
    kubectl: Kubectl, ns: str, manifest: dict[str, Any], *, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest), check=check)


def status(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any]:
    return dict(get(kubectl, "cpl", name, "-n", ns).get("status") or {})


def condition(kubectl: Kubectl, ns: str, name: str, ctype: str) -> dict[str, Any]:
    return dict(next(c for c in status(kubectl, ns, name)["conditions"] if c["type"] == ctype))


@pytest.fixture(scope="module")
def pipelines_crd(control_plane: ControlPlane) -> None:
    control_plane.kubectl("apply", "-f", str(CRD))

    # Not `kubectl wait --for=condition=Established`: right after the apply the CRD may have no
    # status.conditions yet, and kubectl 1.34 then fails ("accessor error") instead of waiting.
    def established() -> bool:
        crd = get(control_plane.kubectl, "crd", "consumerpipelines.offtake.dev")
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for(established, timeout=60, what="the ConsumerPipeline CRD established")


#: Who may scrape the workers (the chart's networkPolicy.metricsFrom).
SCRAPERS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane, pipelines_crd: None) -> Iterator[OperatorContext]:
    config = OperatorConfig(
        worker_image="offtake:e2e",
        resync_seconds=3,
        lag_interval_seconds=2,
        kafka_timeout_seconds=3,
        rewind_poll_seconds=1,
        worker_network_policy=True,
        worker_metrics_from=(SCRAPERS,),
    )
    with operator_running(control_plane, config) as ctx:
        yield ctx


def example_secrets(kubectl: Kubectl, ns: str) -> None:
    """The Secrets the examples name (examples/sidecar.yaml: kafka-credentials)."""
    kubectl(
        "create",
        "secret",
        "generic",
        "kafka-credentials",
        "-n",
        ns,
        "--from-literal=sasl.username=orders",
        f"--from-literal=sasl.password={EXAMPLE_PASSWORD}",
    )


EXAMPLE_PASSWORD = "example-pw-6f1c"


# ------------------------------------------------------------------------- the resource itself


def test_every_example_applies_and_gets_its_children(
    kubectl: Kubectl, kube_namespace: str, operator: OperatorContext, tmp_path: Path
) -> None:
    ns = kube_namespace
    example_secrets(kubectl, ns)
    names_ = []
    for example in EXAMPLES:
        kubectl("apply", "-n", ns, "-f", str(example))
        names_.append(yaml.safe_load(example.read_text())["metadata"]["name"])
    for name in names_:
        dep = wait_for(
            lambda n=name: get(kubectl, "deployment", n, "-n", ns), what=f"Deployment {name}"
        )
        (ref,) = dep["metadata"]["ownerReferences"]
        assert ref["kind"] == "ConsumerPipeline" and ref["name"] == name and ref["controller"]
        for kind, child in [
            ("configmap", names.configmap_name(name)),
            ("service", names.service_name(name)),
            ("poddisruptionbudget", names.pdb_name(name)),
            ("networkpolicy", policy_name(name)),
        ]:
            obj = get(kubectl, kind, child, "-n", ns)
            assert obj["metadata"]["ownerReferences"][0]["uid"] == ref["uid"]
        # The workers' policy, as the API server stored it: the metrics port from the
        # scrapers only, no rule for the probe port (the kubelet comes from the node).
        (worker,) = dep["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
        policy = get(kubectl, "networkpolicy", policy_name(name), "-n", ns)["spec"]
        assert policy["ingress"] == [
            {"ports": [{"protocol": "TCP", "port": ports["metrics"]}], "from": [SCRAPERS]}
        ]
        assert set(policy["podSelector"]["matchLabels"].items()) <= set(
            dep["spec"]["template"]["metadata"]["labels"].items()
        )
        wait_for(
            lambda n=name: status(kubectl, ns, n).get("phase") == "Pending", what=f"{name} Pending"
        )
        # The rendered config is a manifest the worker loads as it is.
        cm = get(kubectl, "configmap", names.configmap_name(name), "-n", ns)
        path = tmp_path / f"{name}.yaml"
        path.write_text(cm["data"]["pipeline.yaml"])
        assert load_pipeline(path).name == name

    table = kubectl("get", "cpl", "-n", ns).stdout.splitlines()
    assert table[0].split() == COLUMNS
    wide = kubectl("get", "cpl", "-n", ns, "-o", "wide").stdout.splitlines()
    assert wide[0].split() == [*COLUMNS, "PARTITIONS", "UP-TO-DATE", "AUTOSCALER"]
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert set(rows) == set(names_)
    assert all(row[1] == "Pending" for row in rows.values())
    # orders-enrich asks for 2 workers: the ReplicaSet made 2 pods, none ready (no kubelet).
    wait_for(
        lambda: (
            kubectl("get", "cpl", "orders-enrich", "-n", ns, "--no-headers").stdout.split()[2:4]
            == ["0", "2"]
        ),
        what="READY 0 and REPLICAS 2 for orders-enrich",
    )


def test_sidecar_pods_carry_the_processor_as_a_native_sidecar(
    kubectl: Kubectl, kube_namespace: str, operator: OperatorContext
) -> None:
    ns = kube_namespace
    example_secrets(kubectl, ns)
    kubectl("apply", "-n", ns, "-f", str(ROOT / "examples" / "sidecar.yaml"))
    pods = wait_for(
        lambda: get(kubectl, "pods", "-n", ns, "-l", "offtake.dev/pipeline=orders-score")["items"],
        what="the sidecar pipeline's pods",
    )
    spec = pods[0]["spec"]
    (sidecar,) = spec["initContainers"]
    # Accepted by a real API server as a restartable init container: Kubernetes starts it before
    # the worker and stops it after the worker, so a draining worker can still reach it.
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["image"] == "registry.example.com/orders-scorer:1.4"
    assert [c["name"] for c in spec["containers"]] == ["worker"]
    assert spec["terminationGracePeriodSeconds"] == 25 + 15


BAD_MANIFESTS = [
    (
        "two sinks",
        {"sink": {"log": {}, "kafka": {"topic": "t"}}},
        "sink must set exactly one of kafka, spark, log",
    ),
    ("no sink", {"sink": {}}, "sink must set exactly one of kafka, spark, log"),
    (
        "dlq without topic",
        {"errors": {"policy": "dlq"}},
        "errors.dlq.topic is required when errors.policy is dlq",
    ),
    (
        "function and container",
        {"processor": {"function": "a.b:c", "container": {"image": "i"}}},
        "set either processor.function or processor.container, not both",
    ),
    (
        "parquet without path",
        {"sink": {"spark": {"format": "parquet"}}},
        "sink.spark needs jdbc when format is jdbc, and path for the file formats",
    ),
    (
        "connect without url",
        {"sink": {"spark": {"format": "json", "path": "/x", "submit": {"mode": "connect"}}}},
        "sink.spark.submit.connectUrl is required when mode is connect",
    ),
    (
        "bad enum",
        {"source": {"topics": ["o"], "startFrom": "middle"}},
        'spec.source.startFrom: Unsupported value: "middle"',
    ),
    ("negative replicas", {"replicas": -1}, "spec.replicas: Invalid value: -1"),
    ("no topics", {"source": {"topics": []}}, "spec.source.topics: Invalid value"),
    (
        "bad function",
        {"processor": {"function": "not a function"}},
        "spec.processor.function: Invalid value",
    ),
    (
        "rewind without timestamp",
        {"rewind": {"to": "timestamp", "id": "r1"}},
        "rewind.timestamp is required when rewind.to is timestamp",
    ),
    (
        "misspelt field",
        {"limits": {"maxInFlightMesages": 5}},
        'unknown field "spec.limits.maxInFlightMesages"',
    ),
    (
        "inline password",
        {"kafka": {"bootstrapServers": "k:9092", "config": {"sasl.password": "hunter2"}}},
        'spec.kafka.config: Invalid value: "object": key "sasl.password" is a secret',
    ),
    (
        "code-loading sink property",
        {"sink": {"kafka": {"topic": "t", "config": {"plugin.library.paths": "/tmp/evil.so"}}}},
        'spec.sink.kafka.config: Invalid value: "object": key "plugin.library.paths" is refused',
    ),
]


@pytest.mark.parametrize(
    ("case", "spec", "message"), BAD_MANIFESTS, ids=[c[0] for c in BAD_MANIFESTS]
)
def test_bad_manifests_are_rejected_with_a_readable_message(
    kubectl: Kubectl,
    kube_namespace: str,
    pipelines_crd: None,
    case: str,
    spec: dict[str, Any],
    message: str,
) -> None:
    result = apply(kubectl, kube_namespace, pipeline("bad", **spec), check=False)
    assert result.returncode != 0, f"{case}: accepted"
    assert message in result.stderr, result.stderr
    assert not exists(kubectl, "cpl", "bad", "-n", kube_namespace)


def test_a_name_too_long_for_its_children_is_rejected(
    kubectl: Kubectl, kube_namespace: str, pipelines_crd: None
) -> None:
    result = apply(kubectl, kube_namespace, pipeline("p" * 56), check=False)
    assert result.returncode != 0
    assert "metadata.name must be at most 55 characters" in result.stderr


def test_scale_subresource_drives_the_deployment(
    kubectl: Kubectl, kube_namespace: str, operator: OperatorContext
) -> None:
    ns = kube_namespace
    apply(kubectl, ns, pipeline("scaled", replicas=1))
    dep = wait_for(lambda: get(kubectl, "deployment", "scaled", "-n", ns), what="the Deployment")
    checksum = dep["spec"]["template"]["metadata"]["annotations"][names.CHECKSUM_ANNOTATION]
    kubectl("scale", "cpl/scaled", "--replicas=3", "-n", ns)
    wait_for(
        lambda: get(kubectl, "deployment", "scaled", "-n", ns)["spec"]["replicas"] == 3,
        what="3 replicas",
    )
    wait_for(
        lambda: status(kubectl, ns, "scaled").get("replicas") == 3,
        what="status.replicas 3 (3 pods)",
    )
    scale = get(kubectl, "cpl", "scaled", "-n", ns, "--subresource=scale")
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
    assert scale["status"]["selector"] == "offtake.dev/pipeline=scaled"
    dep = get(kubectl, "deployment", "scaled", "-n", ns)
    assert (
        dep["spec"]["template"]["metadata"]["annotations"][names.CHECKSUM_ANNOTATION] == checksum
    ), "scaling must not roll the pods"


def test_pause_and_resume(kubectl: Kubectl, kube_namespace: str, operator: OperatorContext) -> None:
    ns = kube_namespace
    apply(kubectl, ns, pipeline("pausable", replicas=2))
    wait_for(lambda: status(kubectl, ns, "pausable").get("replicas") == 2, what="2 pods")
    patch(kubectl, ns, "cpl/pausable", {"spec": {"paused": True}})
    wait_for(
        lambda: get(kubectl, "deployment", "pausable", "-n", ns)["spec"]["replicas"] == 0,
        what="scaled to 0",
    )
    wait_for(lambda: status(kubectl, ns, "pausable").get("phase") == "Paused", what="phase Paused")
    wait_for(
        lambda: not get(kubectl, "pods", "-n", ns, "-l", "offtake.dev/pipeline=pausable")["items"],
        what="no pods",
    )
    assert kubectl("get", "cpl", "pausable", "-n", ns, "--no-headers").stdout.split()[1] == "Paused"
    patch(kubectl, ns, "cpl/pausable", {"spec": {"paused": False}})
    wait_for(
        lambda: get(kubectl, "deployment", "pausable", "-n", ns)["spec"]["replicas"] == 2,
        what="2 again",
    )
    wait_for(
        lambda: status(kubectl, ns, "pausable").get("phase") == "Pending", what="phase Pending"
    )


def test_deleting_the_pipeline_deletes_its_children(
    kubectl: Kubectl, kube_namespace: str, operator: OperatorContext
) -> None:
    ns = kube_namespace
    apply(kubectl, ns, pipeline("doomed", replicas=1))
    wait_for(lambda: exists(kubectl, "deployment", "doomed", "-n", ns), what="the Deployment")
    wait_for(lambda: exists(kubectl, "pdb", "doomed", "-n", ns), what="the PDB")
    kubectl("delete", "cpl", "doomed", "-n", ns, "--timeout=60s")
    for kind, name in [
        ("deployment", "doomed"),
        ("configmap", "doomed-pipeline"),
        ("service", "doomed-metrics"),
        ("pdb", "doomed"),
    ]:
        wait_for(
            lambda k=kind, n=name: not exists(kubectl, k, n, "-n", ns),
            what=f"{kind} {name} collected",
        )
    wait_for(
        lambda: not get(kubectl, "pods", "-n", ns, "-l", "offtake.dev/pipeline=doomed")["items"],
        what="pods gone",
    )


def test_a_spec_the_worker_rejects_degrades_and_keeps_the_deployment(
    kubectl: Kubectl, kube_namespace: str, operator: OperatorContext
) -> None:
    ns = kube_namespace
    apply(kubectl, ns, pipeline("picky", source={"topics": ["orders"], "groupId": f"{ns}.picky"}))
    wait_for(lambda: status(kubectl, ns, "picky").get("phase") == "Pending", what="phase Pending")
    before = get(kubectl, "deployment", "picky", "-n", ns)
    # Valid for the schema (a non-empty string), not for the worker (blank).
    patch(kubectl, ns, "cpl/picky", {"spec": {"source": {"groupId": "   "}}})
    wait_for(lambda: status(kubectl, ns, "picky").get("phase") == "Degraded", what="phase Degraded")
    degraded = condition(kubectl, ns, "picky", "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec"
    assert (
        degraded["message"]
        == "spec.source.groupId: expected a non-empty string, got the string '   '"
    )
    events = wait_for(
        lambda: [
            e
            for e in get(kubectl, "events", "-n", ns)["items"]
            if e["involvedObject"]["name"] == "picky" and e["reason"] == "InvalidSpec"
        ],
        what="an InvalidSpec Event",
    )
    assert events[0]["type"] == "Warning" and "spec.source.groupId" in events[0]["message"]
    # Resyncs run meanwhile (every 3 s): the operator keeps its hands off.
    wait_for_passes(operator, ns, "picky", 2)
    after = get(kubectl, "deployment", "picky", "-n", ns)
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert (
        status(kubectl, ns, "picky")["observedGeneration"]
        == get(kubectl, "cpl", "picky", "-n", ns)["metadata"]["generation"]
    )
    patch(kubectl, ns, "cpl/picky", {"spec": {"source": {"groupId": f"{ns}.picky"}}})
    wait_for(lambda: status(kubectl, ns, "picky").get("phase") == "Pending", what="healed")


# ------------------------------------------------------------------------- the full loop


@dataclass
class PodProcesses:
    worker: subprocess.Popen[bytes]
    log: Path
    grace: float
    sidecars: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    #: Read from the worker's log once it serves: the worker binds port 0 itself, so no other
    #: process can take a port chosen for it in between.
    metrics_port: int | None = None


class LocalKubelet:
    """Runs one pipeline's pods as local processes, as a kubelet would run their containers.

    For each Pod object: native sidecars first (init containers with restartPolicy Always,
    started from ``sidecar_commands[image]`` and waited for until their startup probe answers),
    then the worker container's command and args, with the ConfigMap mounted as a file,
    Secret and projected Secret volumes written out as the kubelet would (``items`` naming the
    files; the Kafka secret directory reaches the worker through OFFTAKE_KAFKA_SECRET_DIR,
    since /etc/offtake does not exist here), POD_NAME from the downward API and a free metrics
    port (each pod has its own network namespace; here they share the host's). Readiness
    (/readyz) is written to the Pod's status, so the ReplicaSet and Deployment controllers count
    ready replicas. A deleted pod's worker gets SIGTERM (SIGKILL after the grace period), and
    only once it has exited do its sidecars get SIGTERM: Kubernetes' order for native sidecars.
    ``timeline`` records it all.
    """

    def __init__(
        self,
        kubectl: Kubectl,
        namespace: str,
        pipeline: str,
        workdir: Path,
        sidecar_commands: dict[str, list[str]] | None = None,
    ) -> None:
        self.kubectl = kubectl
        self.namespace = namespace
        self.pipeline = pipeline
        self.workdir = workdir
        self.sidecar_commands = sidecar_commands or {}
        self.pods: dict[str, PodProcesses] = {}
        self.ready: set[str] = set()
        self.exit_codes: dict[str, int] = {}
        self.sidecar_exit_codes: dict[str, int] = {}
        self.timeline: list[tuple[float, str, str]] = []
        self.started = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="local-kubelet", daemon=True)

    def __enter__(self) -> LocalKubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        for name in list(self.pods):
            self._terminate(name)

    def _note(self, pod: str, what: str) -> None:
        self.timeline.append((time.monotonic(), pod, what))

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as exc:  # keep kubeletting; the test sees the errors
                self.errors.append(repr(exc))
            self._stop.wait(0.5)

    def sync(self) -> None:
        selector = f"offtake.dev/pipeline={self.pipeline}"
        pods = get(self.kubectl, "pods", "-n", self.namespace, "-l", selector)["items"]
        live = {
            p["metadata"]["name"]: p for p in pods if not p["metadata"].get("deletionTimestamp")
        }
        for name in list(self.pods):
            if name not in live:
                self._terminate(name)
        for name, pod in live.items():
            if name not in self.pods and name not in self.exit_codes:
                self._start(pod)
            elif name in self.pods and name not in self.ready and self._is_ready(name):
                self._report_ready(name)

    def _env(self, container: dict[str, Any], pod: str) -> dict[str, str]:
        env = dict(os.environ)
        fields = {"metadata.name": pod, "metadata.namespace": self.namespace}
        for var in container.get("env", []):
            field_path = (var.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
            env[var["name"]] = fields.get(field_path, var.get("value", ""))
        return env

    def _start_sidecar(self, pod: str, container: dict[str, Any]) -> subprocess.Popen[bytes]:
        argv = self.sidecar_commands[container["image"]]
        log = (self.workdir / f"{pod}-{container['name']}.log").open("wb")
        proc = subprocess.Popen(
            argv, env=self._env(container, pod), stdout=log, stderr=subprocess.STDOUT
        )
        self._note(pod, f"start {container['name']}")
        probe = container["startupProbe"]["httpGet"]
        port = next(p["containerPort"] for p in container["ports"] if p["name"] == probe["port"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}{probe['path']}", timeout=1
                ) as resp:
                    if resp.status == 200:
                        self._note(pod, f"{container['name']} started")
                        return proc
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        raise AssertionError(f"sidecar {container['name']} of {pod} never passed its startup probe")

    def _start(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        spec = pod["spec"]
        sidecars = [
            (c["name"], self._start_sidecar(name, c))
            for c in spec.get("initContainers", [])
            if c.get("restartPolicy") == "Always"
        ]
        (container,) = [c for c in spec["containers"] if c["name"] == names.WORKER_CONTAINER]
        cm_name = next(v["configMap"]["name"] for v in spec["volumes"] if v["name"] == "pipeline")
        cm = get(self.kubectl, "configmap", cm_name, "-n", self.namespace)
        config = self.workdir / f"{name}.yaml"
        config.write_text(cm["data"][names.CONFIG_KEY])
        program = container["command"][0]
        command = [shutil.which(program) or program, *container["command"][1:]]
        args = [str(config) if a == names.PIPELINE_PATH else a for a in container["args"]]
        log_path = self.workdir / f"{name}.log"
        log = log_path.open("wb")
        proc = subprocess.Popen(
            # The pods share the host's ports here: any free ones for metrics and probes.
            [*command, *args, "--metrics-port", "0", "--probe-port", "0"],
            env={**self._env(container, name), **self._mount_secrets(name, spec, container)},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
        )
        self._note(name, "start worker")
        self.pods[name] = PodProcesses(
            proc, log_path, float(spec["terminationGracePeriodSeconds"]), sidecars
        )
        self.started += 1

    def _mount_secrets(
        self, pod: str, spec: dict[str, Any], container: dict[str, Any]
    ) -> dict[str, str]:
        """Write the container's Secret volumes to folders; the env that points the worker at
        its Kafka secret directory."""
        volumes = {v["name"]: v for v in spec["volumes"]}
        env: dict[str, str] = {}
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "secret" in volume:
                sources = [{**volume["secret"], "name": volume["secret"]["secretName"]}]
            else:
                projected = (volume.get("projected") or {}).get("sources", [])
                sources = [source["secret"] for source in projected if "secret" in source]
            if not sources:
                continue
            folder = self.workdir / pod / mount["name"]
            folder.mkdir(parents=True)
            for source in sources:
                data = get(self.kubectl, "secret", source["name"], "-n", self.namespace)["data"]
                items = source.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    (folder / item["path"]).write_bytes(base64.b64decode(data[item["key"]]))
            if mount["mountPath"] == names.KAFKA_SECRET_DIR:
                env["OFFTAKE_KAFKA_SECRET_DIR"] = str(folder)
        return env

    def _is_ready(self, name: str) -> bool:
        pod = self.pods[name]
        code = pod.worker.poll()
        if code is not None:
            # A real kubelet would restart it; here the test should see why it ended.
            crash = f"{name}: worker exited {code} before it was ready"
            if crash not in self.errors:
                self.errors.append(crash)
            return False
        if pod.metrics_port is None:
            pod.metrics_port = served_port(pod.log.read_text(errors="replace"))
            if pod.metrics_port is None:
                return False
        try:
            url = f"http://127.0.0.1:{pod.metrics_port}/readyz"
            with urllib.request.urlopen(url, timeout=1) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _report_ready(self, name: str) -> None:
        # Where the pod's metrics are, as on a node: its IP (the host's here: the API server's
        # pod proxy refuses loopback) and, since the pods share the host's ports, the port the
        # worker bound in place of the template's (prometheus.io/port, what scrapers read).
        port = self.pods[name].metrics_port
        self.kubectl(
            "annotate",
            "pod",
            name,
            "-n",
            self.namespace,
            f"prometheus.io/port={port}",
            "--overwrite",
            check=False,
        )
        address = host_address()
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        patch = {
            "status": {
                **({"podIP": address, "podIPs": [{"ip": address}]} if address else {}),
                "phase": "Running",
                "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                ],
            }
        }
        result = self.kubectl(
            "patch",
            "pod",
            name,
            "-n",
            self.namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(patch),
            check=False,
        )
        if result.returncode == 0:
            self.ready.add(name)
            self._note(name, "reported Ready")
        else:  # a busy API server: the next sync reports it again
            self._note(name, f"Ready not reported: {result.stderr.strip()[:200]}")

    def explain(self) -> str:
        """What this kubelet did and what its workers last printed: for a test's failure."""
        lines = [f"{when:.1f} {pod}: {what}" for when, pod, what in self.timeline]
        lines += [f"errors: {self.errors}", f"exit codes: {self.exit_codes}"]
        for pod in sorted({pod for _, pod, _ in self.timeline}):
            log = self.workdir / f"{pod}.log"
            if log.exists():
                tail = log.read_text(errors="replace").splitlines()[-15:]
                lines += [f"--- {pod}.log (last {len(tail)} lines)", *tail]
        return "\n".join(lines)

    @staticmethod
    def _stop_process(proc: subprocess.Popen[bytes], grace: float) -> int:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return int(proc.returncode)

    def _terminate(self, name: str) -> None:
        pod = self.pods.pop(name)
        self.ready.discard(name)
        started = time.monotonic()
        self._note(name, "SIGTERM worker")
        self.exit_codes[name] = self._stop_process(pod.worker, pod.grace)
        self._note(name, f"worker exited {self.exit_codes[name]}")
        for sidecar, proc in reversed(pod.sidecars):  # after the main containers, in reverse
            self._note(name, f"SIGTERM {sidecar}")
            remaining = max(1.0, pod.grace - (time.monotonic() - started))
            self.sidecar_exit_codes[f"{name}/{sidecar}"] = self._stop_process(proc, remaining)
            self._note(name, f"{sidecar} exited")


def host_address() -> str | None:
    """This machine's address on its default route (no packet is sent), None if loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.254", 9))
            address = str(probe.getsockname()[0])
        except OSError:
            return None
    return None if ipaddress.ip_address(address).is_loopback else address


def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(count):
        producer.produce(topic, key=str(i).encode(), value=json.dumps({"id": i}).encode())
    assert producer.flush(30) == 0


def read_all(bootstrap: str, topic: str, *, quiet: float = 3.0) -> list[int]:
    return [int(v["id"]) for v in read_values(bootstrap, topic, quiet=quiet)]


def test_full_loop_workers_from_the_pod_template_reach_zero_lag_and_rewind(
    kubectl: Kubectl,
    kube_namespace: str,
    operator: OperatorContext,
    kafka_broker: Any,
    topic_factory: TopicFactory,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    source, output = topic_factory(partitions=3), topic_factory(partitions=1)
    produce(kafka_broker.bootstrap, source, 300)
    apply(
        kubectl,
        ns,
        pipeline(
            "loop",
            replicas=2,
            kafka={"bootstrapServers": kafka_broker.bootstrap},
            source={"topics": [source], "groupId": f"{ns}.{source}", "format": "json"},
            sink={"kafka": {"topic": output}},
            shutdown={"drainTimeoutSeconds": 5},
        ),
    )
    with LocalKubelet(kubectl, ns, "loop", tmp_path) as kubelet:
        wait_for(
            lambda: status(kubectl, ns, "loop").get("phase") == "Running",
            timeout=120,
            what="phase Running",
            explain=lambda: f"status: {status(kubectl, ns, 'loop')}\n{kubelet.explain()}",
        )
        assert status(kubectl, ns, "loop")["readyReplicas"] == 2
        wait_for(
            lambda: status(kubectl, ns, "loop").get("partitions") == 3,
            what="3 partitions in status",
        )
        wait_for(lambda: status(kubectl, ns, "loop").get("lag") == 0, timeout=120, what="lag 0")
        first = read_all(kafka_broker.bootstrap, output)
        assert sorted(set(first)) == list(range(300))

        # Rewind: workers stop (SIGTERM: drain, commit, leave), offsets go back, workers return.
        patch(kubectl, ns, "cpl/loop", {"spec": {"rewind": {"to": "earliest", "id": "again"}}})
        wait_for(
            lambda: status(kubectl, ns, "loop").get("rewind", {}).get("lastId") == "again",
            timeout=120,
            what="rewind recorded",
        )
        assert kubelet.exit_codes and all(code == 0 for code in kubelet.exit_codes.values()), (
            kubelet.exit_codes
        )
        wait_for(
            lambda: status(kubectl, ns, "loop").get("phase") == "Running",
            timeout=120,
            what="Running again",
        )
        wait_for(
            lambda: status(kubectl, ns, "loop").get("lag") == 0,
            timeout=120,
            what="lag 0 after the rewind",
        )
        assert kubelet.started == 4, "two workers before and two after the rewind"
        second = read_all(kafka_broker.bootstrap, output)
        counts = {i: second.count(i) for i in range(300)}
        assert min(counts.values()) >= 2, "every record went through again after the rewind"
        reasons = {
            e["reason"]
            for e in get(kubectl, "events", "-n", ns)["items"]
            if e["involvedObject"]["name"] == "loop"
        }
        assert {"RewindStarted", "RewindCompleted", "Running"} <= reasons
    assert not kubelet.errors, kubelet.errors


def test_sidecar_mode_worker_drains_through_the_processor_before_it_stops(
    kubectl: Kubectl,
    kube_namespace: str,
    operator: OperatorContext,
    kafka_broker: Any,
    topic_factory: TopicFactory,
    tmp_path: Path,
) -> None:
    """The pod template's native sidecar, run in Kubernetes' order: on pause the worker drains
    its in-flight batches through the processor and exits, and only then is the processor
    stopped. Nothing is lost or duplicated across the stop and the resume."""
    ns = kube_namespace
    source, output = topic_factory(partitions=2), topic_factory(partitions=1)
    total = 1000
    produce(kafka_broker.bootstrap, source, total)
    port = free_port()
    image = "local/offtake-example-sidecar:dev"
    processor = [
        sys.executable,
        str(ROOT / "examples" / "sidecar" / "processor.py"),
        "--port",
        str(port),
        "--delay",
        "0.2",
        "--verbose",
    ]
    apply(
        kubectl,
        ns,
        pipeline(
            "scored",
            replicas=1,
            kafka={"bootstrapServers": kafka_broker.bootstrap},
            source={"topics": [source], "groupId": f"{ns}.{source}", "format": "json"},
            processor={"container": {"image": image, "port": port, "maxBatchRecords": 20}},
            sink={"kafka": {"topic": output}},
            shutdown={"drainTimeoutSeconds": 20},
            # A small in-flight bound: the drain finishes what is in flight, not the backlog.
            limits={"maxInFlightMessages": 40},
        ),
    )
    with LocalKubelet(kubectl, ns, "scored", tmp_path, {image: processor}) as kubelet:
        wait_for(
            lambda: status(kubectl, ns, "scored").get("phase") == "Running",
            timeout=120,
            what="phase Running",
            explain=lambda: f"status: {status(kubectl, ns, 'scored')}\n{kubelet.explain()}",
        )
        # Mid-stream: some records done, many still to go (about 100 records/s through the delay).
        wait_for(
            lambda: 0 < status(kubectl, ns, "scored").get("lag", total) < total,
            timeout=60,
            what="processing under way",
        )
        patch(kubectl, ns, "cpl/scored", {"spec": {"paused": True}})
        wait_for(lambda: kubelet.sidecar_exit_codes, timeout=90, what="the pod stopped")
        (pod,) = kubelet.exit_codes
        events = [what for _, p, what in kubelet.timeline if p == pod]
        t0 = kubelet.timeline[0][0]
        print("\n".join(f"  {t - t0:6.2f}s {what}" for t, p, what in kubelet.timeline if p == pod))
        assert events.index("worker exited 0") < events.index("SIGTERM processor"), events
        assert kubelet.sidecar_exit_codes == {f"{pod}/processor": 0}
        lag_when_paused = wait_for(
            lambda: (
                status(kubectl, ns, "scored").get("phase") == "Paused"
                and status(kubectl, ns, "scored")["lag"]
            ),
            what="lag while paused",
        )
        assert 0 < lag_when_paused < total
        patch(kubectl, ns, "cpl/scored", {"spec": {"paused": False}})
        wait_for(
            lambda: status(kubectl, ns, "scored").get("lag") == 0 and kubelet.started == 2,
            timeout=120,
            what="the rest processed after the resume",
        )
    values = read_values(kafka_broker.bootstrap, output)
    assert sorted(v["id"] for v in values) == list(range(total)), "each record exactly once"
    assert all(v.get("processedBy") == "example-sidecar" for v in values)
    assert not kubelet.errors, kubelet.errors


def read_values(bootstrap: str, topic: str, *, quiet: float = 3.0) -> list[dict[str, Any]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    out: list[dict[str, Any]] = []
    last = time.monotonic()
    try:
        while time.monotonic() - last < quiet:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            out.append(json.loads(msg.value()))
            last = time.monotonic()
    finally:
        consumer.close()
    return out


# ------------------------------------------------------------------- production settings (#12)


def test_every_example_is_admitted_in_a_restricted_namespace(
    kubectl: Kubectl, kube_namespace: str, operator: OperatorContext
) -> None:
    """Pod Security admission (built into kube-apiserver) refuses a ReplicaSet's pods that do not
    meet ``restricted``: the pods exist only if every rendered container passes."""
    ns = kube_namespace
    kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    example_secrets(kubectl, ns)
    wanted = {}
    for example in EXAMPLES:
        kubectl("apply", "-n", ns, "-f", str(example))
        doc = yaml.safe_load(example.read_text())
        wanted[doc["metadata"]["name"]] = int(doc["spec"].get("replicas", 1))
    for name, replicas in wanted.items():
        pods = wait_for(
            lambda n=name, r=replicas: (
                len(
                    items := get(kubectl, "pods", "-n", ns, "-l", f"offtake.dev/pipeline={n}")[
                        "items"
                    ]
                )
                == r
                and items
            ),
            what=f"{replicas} pod(s) of {name} admitted",
        )
        for pod in pods:
            for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
                assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}, c["name"]
    rs_events = kubectl(
        "get", "events", "-n", ns, "--field-selector", "reason=FailedCreate", "-o", "name"
    ).stdout
    assert rs_events.strip() == "", "a ReplicaSet failed to create a pod"


def test_an_override_restricted_would_refuse_is_refused_by_name(
    kubectl: Kubectl, kube_namespace: str, operator: OperatorContext
) -> None:
    ns = kube_namespace
    body = pipeline(
        "rooty", template={"spec": {"containerSecurityContext": {"allowPrivilegeEscalation": True}}}
    )
    apply(kubectl, ns, body)
    wait_for(lambda: status(kubectl, ns, "rooty").get("phase") == "Degraded", what="Degraded")
    message = condition(kubectl, ns, "rooty", "Degraded")["message"]
    assert "spec.template.spec.containerSecurityContext.allowPrivilegeEscalation" in message
    assert not exists(kubectl, "deployment", "rooty", "-n", ns)


def test_a_field_removed_from_the_pipeline_disappears_from_the_deployment(
    kubectl: Kubectl, kube_namespace: str, operator: OperatorContext
) -> None:
    ns = kube_namespace
    template = {
        "metadata": {"annotations": {"team": "shop"}},
        "spec": {"nodeSelector": {"pool": "kafka"}, "env": [{"name": "X", "value": "1"}]},
    }
    apply(kubectl, ns, pipeline("slim", template=template))

    def pod_template() -> dict[str, Any]:
        return dict(get(kubectl, "deployment", "slim", "-n", ns)["spec"]["template"])

    wait_for(lambda: pod_template()["spec"].get("nodeSelector"), what="the node selector")
    apply(kubectl, ns, pipeline("slim"))  # kubectl apply drops spec.template from the pipeline
    wait_for(
        lambda: (
            "nodeSelector" not in pod_template()["spec"]
            and "team" not in pod_template()["metadata"].get("annotations", {})
            and all(e["name"] != "X" for e in pod_template()["spec"]["containers"][0]["env"])
        ),
        what="node selector, annotation and env var gone",
    )
    managers = {
        m["manager"]
        for m in get(kubectl, "deployment", "slim", "-n", ns, "--show-managed-fields")["metadata"][
            "managedFields"
        ]
        if m["operation"] == "Apply"
    }
    assert managers == {"offtake"}


def test_a_strimzi_kafkauser_secret_works_and_its_values_stay_secret(
    kubectl: Kubectl, kube_namespace: str, operator: OperatorContext
) -> None:
    ns = kube_namespace
    password = "scram-pw-93be1a"
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="orders-user" password="{password}";'
    )
    # What Strimzi's User Operator writes for a KafkaUser with SCRAM-SHA-512 authentication.
    kubectl(
        "create",
        "secret",
        "generic",
        "orders-user",
        "-n",
        ns,
        f"--from-literal=password={password}",
        f"--from-literal=sasl.jaas.config={jaas}",
    )
    # ... and, beside it, the cluster CA Secret Strimzi makes for the brokers' certificates.
    kubectl(
        "create", "secret", "generic", "my-cluster-cluster-ca-cert", "-n", ns,
        "--from-literal=ca.crt=-----BEGIN CERTIFICATE-----", "--from-literal=ca.password=x",
    )  # fmt: skip
    kafka = {
        "bootstrapServers": "kafka:9093",
        "secretRef": {"name": "orders-user"},
        "caSecretRef": {"name": "my-cluster-cluster-ca-cert"},
        "config": {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"},
    }
    apply(kubectl, ns, pipeline("strimzi", kafka=kafka))
    dep = wait_for(lambda: get(kubectl, "deployment", "strimzi", "-n", ns), what="Deployment")
    (volume,) = [
        v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "kafka-secret"
    ]
    assert [s["secret"] for s in volume["projected"]["sources"]] == [
        {"name": "orders-user", "items": [{"key": "password", "path": "sasl.password"}]},
        {"name": "my-cluster-cluster-ca-cert", "items": [{"key": "ca.crt", "path": "ssl.ca.pem"}]},
    ]
    # The ReplicaSet's pods are created with that volume.
    wait_for(
        lambda: get(kubectl, "pods", "-n", ns, "-l", "offtake.dev/pipeline=strimzi")["items"],
        what="a pod",
    )
    cm = get(kubectl, "configmap", "strimzi-pipeline", "-n", ns)
    assert "sasl.username: orders-user" in cm["data"]["pipeline.yaml"]
    wait_for(lambda: status(kubectl, ns, "strimzi").get("phase") == "Pending", what="Pending")
    # The password appears in no object Offtake writes (nor in the Events it posts).
    for kind in ("deployments", "replicasets", "pods", "configmaps", "services", "events", "cpl"):
        text = kubectl("get", kind, "-n", ns, "-o", "json").stdout
        assert password not in text, kind


def test_a_secret_that_would_run_a_command_in_the_operator_degrades_the_pipeline(
    kubectl: Kubectl, kube_namespace: str, operator: OperatorContext
) -> None:
    """A tenant's Kafka Secret with sasl.kerberos.kinit.cmd (a shell command librdkafka runs
    for GSSAPI; the PyPI wheel has no GSSAPI, a librdkafka built with libsasl2 does): the
    operator's clients and the workers would run it. Degraded naming the key, no Deployment."""
    ns = kube_namespace
    kubectl(
        "create", "secret", "generic", "kinit", "-n", ns,
        "--from-literal=sasl.username=u", "--from-literal=sasl.kerberos.kinit.cmd=touch /tmp/x",
    )  # fmt: skip
    kafka = {
        "bootstrapServers": "kafka:9093",
        "secretRef": {"name": "kinit"},
        "config": {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI"},
    }
    apply(kubectl, ns, pipeline("kinit", kafka=kafka))
    wait_for(lambda: status(kubectl, ns, "kinit").get("phase") == "Degraded", what="Degraded")
    message = condition(kubectl, ns, "kinit", "Degraded")["message"]
    assert "'sasl.kerberos.kinit.cmd' is refused" in message and "touch" not in message, message
    assert not exists(kubectl, "deployment", "kinit", "-n", ns)


def test_a_jdbc_password_secret_ref_reaches_the_pod_only_as_a_secret_key_ref(
    kubectl: Kubectl, kube_namespace: str, operator: OperatorContext
) -> None:
    ns = kube_namespace
    password = "jdbc-pw-5d0e"
    kubectl("create", "secret", "generic", "shop-db", "-n", ns, f"--from-literal=pw={password}")
    jdbc = {
        "url": "jdbc:postgresql://db:5432/shop",
        "table": "orders",
        "user": "writer",
        "passwordSecretRef": {"name": "shop-db", "key": "pw"},
    }
    apply(kubectl, ns, pipeline("jdbc", sink={"spark": {"format": "jdbc", "jdbc": jdbc}}))
    dep = wait_for(lambda: get(kubectl, "deployment", "jdbc", "-n", ns), what="Deployment")
    (worker,) = dep["spec"]["template"]["spec"]["containers"]
    (env,) = [e for e in worker["env"] if e["name"] == "OFFTAKE_JDBC_PASSWORD"]
    assert env == {
        "name": "OFFTAKE_JDBC_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "shop-db", "key": "pw"}},
    }
    for kind in ("deployments", "replicasets", "configmaps", "events", "cpl"):
        assert password not in kubectl("get", kind, "-n", ns, "-o", "json").stdout, kind
    # And the inline form never gets that far: the API server refuses it, naming the field.
    inline = {**jdbc, "password": password}
    del inline["passwordSecretRef"]
    refused = apply(
        kubectl, ns, pipeline("inline", sink={"spark": {"format": "jdbc", "jdbc": inline}}),
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "jdbc.passwordSecretRef" in refused.stderr


def test_strimzi_secrets_take_a_pipeline_through_scram_over_tls_and_its_password_leaks_nowhere(
    kubectl: Kubectl,
    kube_namespace: str,
    operator: OperatorContext,
    secured_kafka_broker: KafkaBroker,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Strimzi's Secrets as they are -> the operator's ConfigMap and Secret volume -> a worker
    that consumes through SASL_SSL with SCRAM-SHA-512, and the operator's own lag client too.
    Then the password is looked for everywhere it could have been copied to."""
    ns = kube_namespace
    broker = secured_kafka_broker
    password = broker.scram_users[SCRAM_USER]
    source, output = (
        f"e2e-secured-{uuid.uuid4().hex[:8]}",
        f"e2e-secured-out-{uuid.uuid4().hex[:8]}",
    )
    broker.create_topic(source, 3)
    broker.create_topic(output, 1)
    produce(broker.bootstrap, source, 200)
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{SCRAM_USER}" password="{password}";'
    )
    kubectl(
        "create", "secret", "generic", "orders-user", "-n", ns,
        f"--from-literal=password={password}", f"--from-literal=sasl.jaas.config={jaas}",
    )  # fmt: skip
    # The cluster CA Secret as Strimzi writes it: the PEM certificate and a binary keystore.
    (tmp_path / "ca.crt").write_text(broker.ca_pem)
    (tmp_path / "ca.p12").write_bytes(bytes(range(256)))
    kubectl(
        "create", "secret", "generic", "my-cluster-cluster-ca-cert", "-n", ns,
        f"--from-file=ca.crt={tmp_path / 'ca.crt'}", f"--from-file=ca.p12={tmp_path / 'ca.p12'}",
        "--from-literal=ca.password=p12-password",
    )  # fmt: skip
    apply(
        kubectl,
        ns,
        pipeline(
            "secured",
            replicas=1,
            kafka={
                "bootstrapServers": broker.listener_bootstrap(SCRAM_TLS_LISTENER),
                "secretRef": {"name": "orders-user"},
                "caSecretRef": {"name": "my-cluster-cluster-ca-cert"},
                "config": {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"},
            },
            source={"topics": [source], "groupId": f"{ns}.{source}", "format": "json"},
            sink={"kafka": {"topic": output}},
            shutdown={"drainTimeoutSeconds": 5},
        ),
    )
    pages: list[str] = []
    with caplog.at_level(logging.DEBUG), LocalKubelet(kubectl, ns, "secured", tmp_path) as kubelet:
        wait_for(
            lambda: status(kubectl, ns, "secured").get("phase") == "Running",
            timeout=120,
            what="phase Running",
            explain=lambda: f"status: {status(kubectl, ns, 'secured')}\n{kubelet.explain()}",
        )
        # Lag comes from the operator's own admin client, with the same Secrets' properties.
        wait_for(lambda: status(kubectl, ns, "secured").get("lag") == 0, timeout=120, what="lag 0")
        assert sorted(set(read_all(broker.bootstrap, output))) == list(range(200))
        for pod in kubelet.pods.values():
            for path in ("/metrics", "/healthz", "/readyz"):
                url = f"http://127.0.0.1:{pod.metrics_port}{path}"
                with urllib.request.urlopen(url, timeout=5) as answer:
                    pages.append(answer.read().decode())
    assert not kubelet.errors, kubelet.errors
    assert any("offtake_" in page for page in pages)
    cm = get(kubectl, "configmap", "secured-pipeline", "-n", ns)
    assert f"sasl.username: {SCRAM_USER}" in cm["data"]["pipeline.yaml"]
    # Everything the operator writes, the Events it posts, the status it reports ...
    seen = {
        kind: kubectl("get", kind, "-n", ns, "-o", "json").stdout
        for kind in ("deployments", "replicasets", "pods", "configmaps", "services", "events")
    }
    seen["status"] = json.dumps(status(kubectl, ns, "secured"))
    # ... the worker's stdout/stderr, its /metrics and probes, and the operator's own logs.
    seen.update({f"log {p.name}": p.read_text() for p in tmp_path.glob("*.log")})
    seen.update({f"page {i}": page for i, page in enumerate(pages)})
    seen["operator log"] = caplog.text
    assert caplog.records, "the operator's log records were captured"
    for where, text in seen.items():
        assert password not in text, where
    for topic in (source, output):
        broker.delete_topic(topic, missing_ok=True)
