"""spec.mode: inject on a real node: records flow from Kafka through the injected worker into an
application written in Go (examples/sidecar/go, in an image of its own), and every record is
acknowledged exactly once across a rolling update of the user's Deployment.

What runs: the real apiserver calls the operator's webhook (this process, TLS on loopback) for
the pods the ReplicaSets create; the kubelet runs them with containerd and runc; the worker
(the worker image, with this checkout's package) and the Go app share the pod's localhost; the
broker listens on the node's bridge, where the pods reach it. On each old pod's termination
the app's preStop hook (injected) drains the worker through the app before the app stops.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer
from support.inject import install_crd, operator_with_webhook
from support.kube import get, wait_for
from support.workers import wait_caught_up

from offtake_testbed._cache import cache_dir
from offtake_testbed.kafka import KafkaBroker, read_topic
from offtake_testbed.kube import ControlPlane
from offtake_testbed.node import GATEWAY_IP, Node, image_archive
from offtake_testbed.node.install import buildah_command

os.environ.setdefault("OFFTAKE_TICK_SECONDS", "1")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
GO_APP = ROOT / "examples" / "sidecar" / "go"
APP_IMAGE = "localhost/offtake-example-sidecar-go:node-test"
#: The worker image the pods run; its package must be this checkout's (scripts/build-image.sh
#: --target worker builds it).
WORKER_IMAGE = os.environ.get("OFFTAKE_INJECT_WORKER_IMAGE", "localhost/offtake-worker:0.1.0")
BEFORE, DURING = 3000, 3000


def buildah(*args: str) -> str:
    proc = subprocess.run([*buildah_command(), *args], capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def go_app_image() -> str:
    """The Go reference processor, a static binary, in an image with nothing else (as its
    Dockerfile's distroless stage, built here with buildah instead of docker)."""
    source = (GO_APP / "main.go").read_bytes() + (GO_APP / "go.mod").read_bytes()
    binary = cache_dir("sidecar-go") / f"sidecar-{hashlib.sha256(source).hexdigest()[:16]}"
    if not binary.exists():
        env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}
        go = "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else "go"
        subprocess.run([go, "build", "-o", str(binary), "."], cwd=GO_APP, env=env, check=True)
    box = buildah("from", "scratch")
    try:
        buildah("copy", "--chmod", "0755", box, str(binary), "/sidecar")
        # A short pause per batch keeps batches in flight while the pods roll.
        entry = ["/sidecar", "--host", "0.0.0.0", "--port", "8080", "--delay", "20ms"]
        buildah("config", "--entrypoint", json.dumps(entry), "--user", "10001:10001", box)
        buildah("commit", "--quiet", box, APP_IMAGE)
    finally:
        subprocess.run([*buildah_command(), "rm", box], capture_output=True, check=False)
    return APP_IMAGE


@pytest.fixture
def broker(kube_node: Node) -> Iterator[KafkaBroker]:
    """A broker the pods reach: advertised at the node's bridge address (the bridge exists
    once the node runs)."""
    with KafkaBroker(host=GATEWAY_IP) as kafka:
        yield kafka


def produce(
    bootstrap: str,
    first: int,
    count: int,
    per_second: float | None = None,
    underway: threading.Event | None = None,
) -> None:
    """Produce ``count`` records keyed k<first>...; with ``per_second``, paced (the pause is
    the pace, not a wait), setting ``underway`` once a tenth of them is acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    acked = 0

    def delivered(err: Any, _msg: Any) -> None:
        nonlocal acked
        acked += err is None
        if underway is not None and acked >= count // 10:
            underway.set()

    for i in range(first, first + count):
        value = json.dumps({"name": f"n{i}", "i": i}).encode()
        producer.produce("orders", key=f"k{i}".encode(), value=value, on_delivery=delivered)
        if per_second:
            producer.poll(0)
            time.sleep(1 / per_second)
    assert producer.flush(30) == 0


def deployment(ns: str) -> dict[str, Any]:
    restricted = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "scorer", "namespace": ns},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "scorer"}},
            "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {
                    # The label lets the API server send the pods to the webhook at all.
                    "labels": {"app": "scorer", "offtake.dev/pipeline": "orders-score"},
                    "annotations": {"offtake.dev/pipeline": "orders-score"},
                },
                "spec": {
                    "securityContext": {
                        "runAsNonRoot": True,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "scorer",
                            "image": APP_IMAGE,
                            "imagePullPolicy": "Never",
                            "ports": [{"containerPort": 8080}],
                            "readinessProbe": {
                                "httpGet": {"path": "/healthz", "port": 8080},
                                "periodSeconds": 2,
                            },
                            "securityContext": restricted,
                        }
                    ],
                },
            },
        },
    }


def test_records_flow_through_the_injected_worker_exactly_once_across_a_rolling_update(
    control_plane: ControlPlane,
    kube_node: Node,
    broker: KafkaBroker,
    kube_namespace: str,
    tmp_path: Path,
) -> None:
    ns, kubectl = kube_namespace, control_plane.kubectl
    for image in (WORKER_IMAGE, go_app_image()):
        result = kube_node.ctr("images", "import", str(image_archive(image)))
        assert result.returncode == 0, result.stderr
    broker.create_topic("orders", partitions=2)
    broker.create_topic("scored", partitions=1)
    produce(broker.bootstrap, 0, BEFORE)
    pipeline = {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": "orders-score", "namespace": ns},
        "spec": {
            "mode": "inject",
            "kafka": {"bootstrapServers": broker.bootstrap},
            "source": {"topics": ["orders"], "startFrom": "earliest"},
            "processor": {"container": {"port": 8080, "maxBatchRecords": 50}},
            "sink": {"kafka": {"topic": "scored"}},
            "commit": {"intervalSeconds": 0.5},
            "shutdown": {"drainTimeoutSeconds": 20},
        },
    }
    install_crd(kubectl)
    settings = {
        "worker_image": WORKER_IMAGE,
        "worker_image_pull_policy": "Never",
        "resync_seconds": 2.0,
        "lag_interval_seconds": 2.0,
    }
    began = time.monotonic()
    with operator_with_webhook(control_plane, ns, tmp_path, **settings):
        wait_for(lambda: kubectl("apply", "-f", "-", input=yaml.safe_dump(pipeline)), timeout=30)
        wait_for(lambda: get(kubectl, "configmap", "orders-score-pipeline", "-n", ns), what="cm")
        kubectl("apply", "-f", "-", input=yaml.safe_dump(deployment(ns)))
        kubectl("rollout", "status", "-n", ns, "deployment/scorer", "--timeout=240s", timeout=260)
        started = time.monotonic() - began

        # More records while the Deployment rolls both pods (a template change, as a new
        # image or config would).
        underway = threading.Event()
        writer = threading.Thread(
            target=produce, args=(broker.bootstrap, BEFORE, DURING, 100.0, underway)
        )
        writer.start()
        # The roll starts once the writer's records are reaching the broker, so that records
        # arrive while the pods roll.
        assert underway.wait(120), "the writer's first records were not acknowledged"
        old = {
            p["metadata"]["name"]
            for p in get(kubectl, "pods", "-n", ns, "-l", "app=scorer")["items"]
        }
        patch = {"spec": {"template": {"metadata": {"annotations": {"rolled": "1"}}}}}
        kubectl("patch", "deployment", "scorer", "-n", ns, "--type=merge", "-p", json.dumps(patch))
        kubectl("rollout", "status", "-n", ns, "deployment/scorer", "--timeout=300s", timeout=320)
        writer.join(120)
        assert not writer.is_alive()
        total = BEFORE + DURING

        def delivered() -> list[Any] | None:
            out = read_topic(broker.bootstrap, "scored", timeout=30)
            return out if len(out) >= total else None

        wait_for(delivered, timeout=180, what=f"{total} records in the output topic")
        # Once the group's committed offsets reach the input's log end, no record can be
        # processed again (the sink flushes before a commit), so what the output holds now is
        # final: a duplicate would already be in it.
        wait_caught_up(broker.bootstrap, f"{ns}.orders-score", "orders", 2, timeout=120)
        out = read_topic(broker.bootstrap, "scored", timeout=30)
        counts = Counter(m.key().decode() for m in out)
        assert set(counts) == {f"k{i}" for i in range(total)}
        assert [k for k, n in counts.items() if n != 1] == []
        assert len(out) == total
        assert all(json.loads(m.value())["processedBy"] == "example-sidecar" for m in out)
        # The pods of the rollout are new ones, each with its worker ready, and the pipeline's
        # status says so, with the lag drained and the partitions known.
        pods = get(kubectl, "pods", "-n", ns, "-l", "app=scorer")["items"]
        assert len(pods) == 2 and not old & {p["metadata"]["name"] for p in pods}

        def settled() -> Any:
            st = get(kubectl, "cpl", "orders-score", "-n", ns).get("status") or {}
            ready = [p for p in st.get("injectedPods") or [] if p["ready"]]
            return len(ready) == 2 and st.get("lag") == 0 and st

        # The old pods' preStop hooks (GET /drain, sent by the kubelet from the node) all
        # answered 200: the kubelet posts FailedPreStopHook for a hook that fails (wrong port,
        # a refused peer or a drain that did not finish).
        events = get(kubectl, "events", "-n", ns)["items"]
        assert [e["message"] for e in events if e["reason"] == "FailedPreStopHook"] == []
        killed = [
            e for e in events if e["reason"] == "Killing" and e["involvedObject"]["name"] in old
        ]
        assert {e["involvedObject"]["name"] for e in killed} == old
        st = wait_for(settled, timeout=60, what="2 ready injected pods and no lag in status")
        assert st["partitions"] == 2 and st["phase"] == "Running"
        excess = next(c for c in st["conditions"] if c["type"] == "ReplicasExceedPartitions")
        assert excess["status"] == "False"
        # Scaling the workload scales consumption; past the partition count, status warns.
        kubectl("scale", "deployment", "scorer", "-n", ns, "--replicas=3")

        def warned() -> Any:
            st = get(kubectl, "cpl", "orders-score", "-n", ns).get("status") or {}
            cond = next(c for c in st["conditions"] if c["type"] == "ReplicasExceedPartitions")
            return cond["status"] == "True" and len(st["injectedPods"]) == 3 and cond

        cond = wait_for(warned, timeout=120, what="the ReplicasExceedPartitions warning")
        assert "3 pods consume 2 partitions: 1 workers stay idle" in cond["message"]
        print(
            f"\n{total} records ({DURING} during the rolling update) delivered exactly once; "
            f"pods ready {started:.0f} s after the operator started, "
            f"{time.monotonic() - began:.0f} s in all"
        )
