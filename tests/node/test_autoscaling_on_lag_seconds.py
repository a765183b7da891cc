"""Autoscaling on lag seconds, end to end on real parts: worker pods of the worker image on the
test bed's node consume a backlog from Kafka, a real Prometheus scrapes them (Kubernetes service
discovery through the real apiserver), prometheus-adapter serves offtake_consumer_lag_seconds
as an external metric to the apiserver (an APIService), the kube-controller-manager's HPA scales
the pipeline up, the new workers take partitions, the lag drains and it scales back down.
Prometheus finds the pods through the apiserver (file_sd, kept by this test: Debian's
Prometheus has no Kubernetes discovery).

prometheus-adapter is built from the Go module proxy with the node's other parts
(:mod:`offtake_testbed.prometheus_adapter`).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from offtake_testbed.kafka import KafkaBroker, read_topic
from offtake_testbed.kube import ControlPlane
from offtake_testbed.node import GATEWAY_IP, Node
from offtake_testbed.prometheus import Prometheus
from offtake_testbed.prometheus_adapter import install_prometheus_adapter
from offtake_testbed.pytest_plugin_kube import Kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

METRIC = "offtake_consumer_lag_seconds"
PARTITIONS = 4


@pytest.fixture(scope="module")
def pod_kafka(kube_node: Node) -> Iterator[KafkaBroker]:
    """A broker the pods reach: advertised on the node's bridge address."""
    with KafkaBroker(host=GATEWAY_IP) as broker:
        yield broker


def _worker_targets(cp: ControlPlane) -> list[dict[str, Any]]:
    """file_sd targets of every running worker pod: its metrics port, namespace and pipeline."""
    pods = json.loads(
        cp.kubectl("get", "pods", "-A", "-l", "offtake.dev/pipeline", "-o", "json").stdout
    )["items"]
    targets = []
    for pod in pods:
        ip = pod.get("status", {}).get("podIP")
        ports = [
            port["containerPort"]
            for c in pod["spec"]["containers"]
            for port in c.get("ports", [])
            if port.get("name") == "metrics"
        ]
        if ip and ports and pod["status"].get("phase") == "Running":
            labels = {
                "namespace": pod["metadata"]["namespace"],
                "pipeline": pod["metadata"]["labels"]["offtake.dev/pipeline"],
                "pod": pod["metadata"]["name"],
            }
            targets.append({"targets": [f"{ip}:{ports[0]}"], "labels": labels})
    return targets


@pytest.fixture(scope="module")
def pod_prometheus(control_plane: ControlPlane, kube_node: Node) -> Iterator[Prometheus]:
    """Scrapes every running worker pod's metrics port, labelled namespace and pipeline.

    Debian's Prometheus is built without Kubernetes service discovery, so a thread here
    does the discovery the Prometheus Operator would (pods from the apiserver) into a
    file_sd file that Prometheus re-reads."""
    work = Path(tempfile.mkdtemp(prefix="offtake-sd-"))
    targets = work / "workers.json"
    targets.write_text("[]")
    prom = Prometheus(
        scrape_configs=[
            {
                "job_name": "offtake",
                "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "2s"}],
            }
        ],
    ).start()
    stop = threading.Event()

    def discover() -> None:
        while not stop.wait(2):
            try:
                found = _worker_targets(control_plane)
            except Exception:  # the apiserver is busy: try again next round
                continue
            tmp = work / "workers.tmp"
            tmp.write_text(json.dumps(found))
            tmp.replace(targets)

    thread = threading.Thread(target=discover, name="pod-discovery", daemon=True)
    thread.start()
    try:
        yield prom
    finally:
        stop.set()
        thread.join(timeout=10)
        prom.stop()


ADAPTER_CONFIG = {
    "externalRules": [
        {
            "seriesQuery": f'{METRIC}{{namespace!="",pipeline!=""}}',
            "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
            "name": {"as": METRIC},
            "metricsQuery": "max by (pipeline) (<<.Series>>{<<.LabelMatchers>>})",
        }
    ]
}


@pytest.fixture(scope="module")
def metrics_adapter(control_plane: ControlPlane, pod_prometheus: Prometheus) -> Iterator[None]:
    """prometheus-adapter on the host, registered as external.metrics.k8s.io v1beta1."""
    binary = install_prometheus_adapter()
    work = Path(tempfile.mkdtemp(prefix="offtake-adapter-"))
    (work / "config.yaml").write_text(yaml.safe_dump(ADAPTER_CONFIG))
    port = 16443
    kc = str(control_plane.kubeconfig)
    with (work / "adapter.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                str(binary),
                f"--prometheus-url={pod_prometheus.url}",
                f"--config={work / 'config.yaml'}",
                f"--lister-kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                f"--secure-port={port}",
                f"--cert-dir={work / 'certs'}",
                # Discovery (/apis/...) is a non-resource path RBAC does not grant anonymous.
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/openapi/*,/apis,/apis/*",
                "--metrics-relist-interval=5s",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    name = "offtake-metrics-adapter"
    # The test bed's apiserver has no proxy client certificate: it calls the adapter
    # anonymously, and the adapter asks the apiserver whether anonymous may read the metrics.
    control_plane.apply(
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": name},
                "rules": [
                    {
                        "apiGroups": ["external.metrics.k8s.io"],
                        "resources": ["*"],
                        "verbs": ["get", "list", "watch"],
                    }
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": name,
                },
                "subjects": [
                    {
                        "kind": "User",
                        "name": "system:anonymous",
                        "apiGroup": "rbac.authorization.k8s.io",
                    }
                ],
            },
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": "kube-system"},
                "spec": {"ports": [{"port": 443, "targetPort": port}]},
            },
            {
                "apiVersion": "v1",
                "kind": "Endpoints",
                "metadata": {"name": name, "namespace": "kube-system"},
                "subsets": [{"addresses": [{"ip": GATEWAY_IP}], "ports": [{"port": port}]}],
            },
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
                "spec": {
                    "group": "external.metrics.k8s.io",
                    "version": "v1beta1",
                    "insecureSkipTLSVerify": True,
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                    "service": {"name": name, "namespace": "kube-system", "port": 443},
                },
            },
        ]
    )
    try:
        yield
    finally:
        control_plane.kubectl("delete", "apiservice", "v1beta1.external.metrics.k8s.io")
        proc.terminate()
        proc.wait(timeout=30)


def _get(kubectl: Kubectl, *args: str) -> dict[str, Any]:
    result = kubectl("get", *args, "-o", "json", check=False)
    return dict(json.loads(result.stdout)) if result.returncode == 0 else {}


def _install_crd(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", str(Path(__file__).resolve().parents[2] / "crds/consumerpipeline.yaml"))
    for _ in range(30):  # right after the apply the CRD may have no conditions yet
        established = kubectl(
            "wait", "--for=condition=Established", "crd/consumerpipelines.offtake.dev", check=False
        )
        if established.returncode == 0:
            break
        time.sleep(1)


def _operator_config() -> Any:
    from offtake_operator.settings import OperatorConfig

    return OperatorConfig(
        resync_seconds=2,
        lag_interval_seconds=2,
        kafka_timeout_seconds=5,
        worker_image="localhost/offtake-worker:0.1.0",
        worker_image_pull_policy="Never",
    )


def test_the_hpa_scales_workers_up_on_lag_seconds_and_back_down_once_drained(
    control_plane: ControlPlane,
    kube_node: Node,
    pod_kafka: KafkaBroker,
    pod_prometheus: Prometheus,
    metrics_adapter: None,
    kubectl: Kubectl,
    kube_namespace: str,
) -> None:
    from offtake_operator.embedded import OperatorThread

    ns, name = kube_namespace, "orders"
    _install_crd(kubectl)
    source, sink = f"scale-{uuid.uuid4().hex[:6]}", f"scale-out-{uuid.uuid4().hex[:6]}"
    pod_kafka.create_topic(source, PARTITIONS)
    pod_kafka.create_topic(sink, PARTITIONS)
    total = 480
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": pod_kafka.bootstrap, "linger.ms": 5})
    for i in range(total):
        producer.produce(source, json.dumps({"id": i}).encode(), partition=i % PARTITIONS)
    producer.flush(30)
    pipeline = {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "kafka": {"bootstrapServers": pod_kafka.bootstrap},
            "source": {"topics": [source], "groupId": f"{ns}.{source}", "startFrom": "earliest"},
            "sink": {"kafka": {"topic": sink, "delivery": "exactly-once"}},
            # One record in flight and a commit every 50 ms: a worker does ~10-20 records/s,
            # so one worker lags behind the backlog and more workers drain it faster.
            "limits": {"maxInFlightMessages": 1},
            "commit": {"intervalSeconds": 0.05},
            "autoscaling": {
                "enabled": True,
                "minReplicas": 1,
                "maxReplicas": 10,
                "targetLagSeconds": 10,
                "scaleDownStabilizationSeconds": 30,
            },
        },
    }
    config = _operator_config()
    seen: list[tuple[float, int, int, str]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBECONFIG", str(control_plane.kubeconfig))
        with OperatorThread(config):
            kubectl("apply", "-f", "-", input=json.dumps(pipeline))
            started = time.monotonic()
            peak, scaled_up_at, drained_at, back_down_at = 1, None, None, None
            while time.monotonic() - started < 600:
                cpl = _get(kubectl, "cpl", name, "-n", ns)
                hpa = _get(kubectl, "hpa", name, "-n", ns)
                replicas = int((cpl.get("spec") or {}).get("replicas") or 0)
                ready = int((cpl.get("status") or {}).get("readyReplicas") or 0)
                lag = (cpl.get("status") or {}).get("lagSeconds")
                metric = json.dumps((hpa.get("status") or {}).get("currentMetrics"))
                t = round(time.monotonic() - started, 1)
                seen.append((t, replicas, ready, f"lag {lag} hpa {metric}"))
                print(seen[-1], flush=True)
                peak = max(peak, replicas)
                if replicas > 1 and scaled_up_at is None:
                    scaled_up_at = t
                if scaled_up_at and lag == 0 and drained_at is None:
                    drained_at = t
                if drained_at and replicas == 1:
                    back_down_at = t
                    break
                time.sleep(3)
    print(f"\nreplicas over time: {[(t, r, rd) for t, r, rd, _ in seen]}")
    print(f"scaled up at {scaled_up_at} s, drained at {drained_at} s, back to 1 at {back_down_at}")
    assert scaled_up_at is not None, seen
    assert 1 < peak <= PARTITIONS, seen
    assert back_down_at is not None, seen
    # Exactly-once sink: every record once in the output, whatever the rebalances did.
    ids = sorted(json.loads(m.value())["id"] for m in read_topic(pod_kafka.bootstrap, sink))
    assert len(ids) == total and set(ids) == set(range(total)), (
        f"{total - len(set(ids))} lost, {len(ids) - len(set(ids))} duplicated"
    )


#: One partition, so that every worker past the first exists only because queue mode shares a
#: partition (issue 39 item 4).
QUEUE_PARTITIONS = 1
QUEUE_MAX_REPLICAS = 4


def _hpa_value(hpa: dict[str, Any]) -> float | None:
    """The HPA's current reading of the external metric (the workers' max lag seconds)."""
    for m in (hpa.get("status") or {}).get("currentMetrics") or []:
        current = (m.get("external") or {}).get("current") or {}
        raw = current.get("value") or current.get("averageValue")
        if raw is not None:
            text = str(raw)
            return float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    return None


def test_queue_mode_scales_past_the_partitions_on_the_age_of_records_and_back(
    control_plane: ControlPlane,
    kube_node: Node,
    pod_kafka: KafkaBroker,
    pod_prometheus: Prometheus,
    metrics_adapter: None,
    kubectl: Kubectl,
    kube_namespace: str,
) -> None:
    """Queue mode (source.groupType share) on a 1-partition topic: a backlog of slow work
    items (offtake_examples.jobs, 50 ms each) makes the records older and older when the one
    worker acquires them (offtake_consumer_lag_seconds in queue mode); the HPA scales past the
    partition to up to 4 workers, more than one of which take records, then back to 1 once
    drained."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    from offtake_operator.embedded import OperatorThread

    ns, name = kube_namespace, "jobs"
    _install_crd(kubectl)
    source, sink = f"jobs-{uuid.uuid4().hex[:6]}", f"jobs-out-{uuid.uuid4().hex[:6]}"
    group = f"{ns}.{source}"
    pod_kafka.create_topic(source, QUEUE_PARTITIONS)
    pod_kafka.create_topic(sink, QUEUE_PARTITIONS)
    # At most 100 records of a partition acquired at once (the broker's minimum): a poll
    # (200 records of 50 ms: 10 s) fits in the 30 s lock, and what one worker does not hold,
    # the others can acquire.
    admin = AdminClient({"bootstrap.servers": pod_kafka.bootstrap})
    entry = ConfigEntry(
        "share.partition.max.record.locks", "100", incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource], request_timeout=15).values():
        future.result()
    total = 1_600
    # Batches of 20: the broker hands out whole batches, and one of hundreds of slow records
    # would not fit in the lock (released again and again, DeliveredTooOften).
    producer = Producer(
        {"bootstrap.servers": pod_kafka.bootstrap, "linger.ms": 5, "batch.num.messages": 20}
    )
    for i in range(total):
        value = json.dumps({"id": i, "seconds": 0.05}).encode()
        producer.produce(source, value, partition=i % QUEUE_PARTITIONS)
    producer.flush(30)
    pipeline = {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "kafka": {"bootstrapServers": pod_kafka.bootstrap},
            "source": {
                "topics": [source],
                "groupId": group,
                "groupType": "share",
                "startFrom": "earliest",
            },
            "processor": {"function": "offtake_examples.jobs:handle"},
            "sink": {"kafka": {"topic": sink}},
            "autoscaling": {
                "enabled": True,
                "minReplicas": 1,
                "maxReplicas": QUEUE_MAX_REPLICAS,
                "targetLagSeconds": 10,
                "scaleDownStabilizationSeconds": 30,
            },
        },
    }
    timeline: list[tuple[float, int, int, float | None]] = []
    busy_workers = 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBECONFIG", str(control_plane.kubeconfig))
        with OperatorThread(_operator_config()):
            kubectl("apply", "-f", "-", input=json.dumps(pipeline))
            started = time.monotonic()
            peak, scaled_up_at, drained_at, back_down_at = 1, None, None, None
            while time.monotonic() - started < 720:
                cpl = _get(kubectl, "cpl", name, "-n", ns)
                status = cpl.get("status") or {}
                replicas = int((cpl.get("spec") or {}).get("replicas") or 0)
                ready = int(status.get("readyReplicas") or 0)
                age = _hpa_value(_get(kubectl, "hpa", name, "-n", ns))
                t = round(time.monotonic() - started, 1)
                timeline.append((t, replicas, ready, age))
                print(f"t={t:>6}s replicas={replicas} ready={ready} lag_seconds={age}", flush=True)
                # Queue mode leaves lag out of status (no committed offsets to count from).
                assert "lag" not in status and "lagSeconds" not in status, status
                peak = max(peak, replicas)
                if replicas > 1 and scaled_up_at is None:
                    scaled_up_at = t
                if replicas > QUEUE_PARTITIONS:
                    # Workers that acquired records in the last 30 s, as Prometheus saw them.
                    working = pod_prometheus.query(
                        f'count(increase(offtake_share_acquired_total{{pipeline="{name}"}}[30s])'
                        " > 0)"
                    )
                    if working:
                        busy_workers = max(busy_workers, int(float(working[0]["value"][1])))
                if scaled_up_at and drained_at is None:
                    done = {
                        json.loads(m.value())["id"] for m in read_topic(pod_kafka.bootstrap, sink)
                    }
                    if len(done) == total:
                        drained_at = t
                if drained_at and replicas == 1:
                    back_down_at = t
                    break
                time.sleep(3)
    print(f"\nqueue mode, partitions {QUEUE_PARTITIONS}, timeline (s, replicas, ready, lag s):")
    for row in timeline:
        print(f"  {row}")
    print(
        f"scaled up at {scaled_up_at} s, peak {peak} replicas ({busy_workers} acquiring at once), "
        f"drained at {drained_at} s, back to 1 at {back_down_at} s"
    )
    assert scaled_up_at is not None, timeline
    assert peak > QUEUE_PARTITIONS, timeline  # more workers than partitions
    assert busy_workers > QUEUE_PARTITIONS, (busy_workers, timeline)  # and all of them worked
    assert back_down_at is not None, timeline
    ids = [json.loads(m.value())["id"] for m in read_topic(pod_kafka.bootstrap, sink)]
    assert set(ids) == set(range(total)), f"{total - len(set(ids))} lost"  # at least once
