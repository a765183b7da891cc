"""``sink.spark.submit.mode: kubernetes`` run for real on the test bed's node.

The parts, all real: the Offtake operator makes the pipeline's SparkConnect, token Secret and
NetworkPolicies; the Kubeflow spark-operator's controller (v2.3.0, built from its Go module,
run as a process against the apiserver: :class:`offtake_testbed.spark_operator.SparkOperator`)
makes the Connect server's pod, ConfigMap and Service; the server (Spark's driver, in client
mode inside its pod) asks the apiserver for two executor pods; the kubelet, containerd and
runc run all of them from the image :mod:`offtake_testbed.spark_image` builds; the worker pod
writes each batch through the server, and Spark's executors write the parquet files.

What the node lacks, and what stands in (docs/spark-sink.md, "Spark on Kubernetes, on a
node"):

- no cluster DNS and no kube-proxy: the workers' ``sc://<pipeline>-spark-server.<ns>.svc``
  does not resolve, so the pipeline's ``spec.template.spec.env`` points
  ``OFFTAKE_SPARK_CONNECT_URL`` at the server pod's IP (the Service the spark-operator made is
  checked, not used); the ``kubernetes`` Service's IP (10.0.0.1:443) is relayed to the
  apiserver (:mod:`offtake_testbed.kube_service_relay`) so that Spark's driver reaches it;
- no shared storage: the node's containerd mounts one host folder into every container
  (:attr:`offtake_testbed.node.Node.shared_dir`), where executors, driver and worker share the
  table, as they would share an object store;
- no NetworkPolicy enforcement (the CNI bridge plugin enforces none): the policies are
  checked as objects, and the test shows a client outside the pipeline reaching the server's
  port, refused by the token alone.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.connect_token import ask, port_open
from support.kube import consumer_pipeline, get, operator_running, patch, wait_for
from support.reports import lost_and_duplicated, report
from support.workers import produce, wait_caught_up

from offtake_testbed.kafka import KafkaBroker
from offtake_testbed.kube import ControlPlane
from offtake_testbed.kube_service_relay import SERVICE_IP, SERVICE_PORT, KubernetesServiceRelay
from offtake_testbed.node import GATEWAY_IP, NODE_NAME, SHARED_MOUNT, Node, image_archive
from offtake_testbed.pytest_plugin_kube import Kubectl
from offtake_testbed.spark_image import SPARK_IMAGE, WORKER_SPARK_IMAGE, build_spark_image
from offtake_testbed.spark_operator import VERSION, SparkOperator, crd_files

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 3000
PARTITIONS = 2
EXECUTORS = 2


@pytest.fixture(scope="module")
def spark_images(kube_node: Node) -> list[str]:
    """The worker-spark image (the worker pod) and the Spark image (server and executors),
    imported into the node's containerd."""
    images = [WORKER_SPARK_IMAGE, build_spark_image()]
    present = set(kube_node.ctr("images", "ls", "-q").stdout.split())
    for image in images:
        if image in present:  # imported by the node's own start (OFFTAKE_NODE_IMAGES)
            continue
        result = kube_node.ctr("images", "import", str(image_archive(image)))
        assert result.returncode == 0, f"importing {image}: {result.stderr}"
    return images


@pytest.fixture(scope="module")
def pod_kafka(kube_node: Node) -> Iterator[KafkaBroker]:
    """A broker the pods reach: advertised on the node's bridge address."""
    with KafkaBroker(host=GATEWAY_IP) as broker:
        yield broker


@pytest.fixture(scope="module")
def apiserver_for_pods(control_plane: ControlPlane, kube_node: Node) -> Iterator[None]:
    with KubernetesServiceRelay(control_plane.apiserver_port):
        yield


def _spark_rbac(ns: str) -> list[dict[str, Any]]:
    """The server's service account: Spark's driver creates and watches its executor pods
    (and their ConfigMap and Services), as the spark-operator chart's spark Role allows."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "spark"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "spark"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods", "services", "configmaps", "persistentvolumeclaims"],
                    "verbs": [
                        "create",
                        "get",
                        "list",
                        "watch",
                        "update",
                        "patch",
                        "delete",
                        "deletecollection",
                    ],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "spark"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "spark"},
            "subjects": [{"kind": "ServiceAccount", "name": "spark", "namespace": ns}],
        },
    ]


def _pipeline(name: str, bootstrap: str, topic: str) -> dict[str, Any]:
    return consumer_pipeline(
        name,
        {
            "kafka": {"bootstrapServers": bootstrap},
            "source": {"topics": [topic], "startFrom": "earliest"},
            "sink": {
                "spark": {
                    "format": "parquet",
                    "path": f"{SHARED_MOUNT}/lake/{name}",
                    "batch": {"maxRecords": 1000, "maxIntervalSeconds": 2},
                    "submit": {
                        "mode": "kubernetes",
                        "image": SPARK_IMAGE,
                        "serviceAccount": "spark",
                        "server": {"cores": 1, "memory": "1g"},
                        "executors": {"instances": EXECUTORS, "cores": 1, "memory": "512m"},
                        "conf": {
                            "spark.sql.shuffle.partitions": "2",
                            # Two cores in all on the node: an executor asks for a tenth.
                            "spark.kubernetes.executor.request.cores": "100m",
                        },
                    },
                }
            },
            "commit": {"intervalSeconds": 0.5},
            # Spark's uid, as the server and executors: the worker renames the files they write.
            "template": {"spec": {"securityContext": {"runAsUser": 185, "runAsGroup": 185}}},
            # No workers until the server's address is known (no DNS on the node: see above).
            "paused": True,
        },
    )


def _pods(kubectl: Kubectl, ns: str, selector: str) -> list[dict[str, Any]]:
    return list(get(kubectl, "pods", "-n", ns, "-l", selector)["items"])


def _running(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        p
        for p in pods
        if p["status"].get("phase") == "Running"
        and all(c.get("ready") for c in p["status"].get("containerStatuses") or [{}])
    ]


def test_a_pipeline_in_kubernetes_mode_writes_through_a_connect_server_and_executor_pods(
    control_plane: ControlPlane,
    kube_node: Node,
    spark_images: list[str],
    pod_kafka: KafkaBroker,
    apiserver_for_pods: None,
    kubectl: Kubectl,
    kube_namespace: str,
) -> None:
    from offtake_operator.settings import OperatorConfig

    ns, name = kube_namespace, "lake"
    kubectl("apply", "-f", str(ROOT / "crds" / "consumerpipeline.yaml"))
    for crd in crd_files():
        kubectl("apply", "--server-side", "-f", str(crd))
    # Right after the apply a CRD may have no conditions yet (kubectl wait then errors).
    wait_for(
        lambda: (
            kubectl("wait", "--for=condition=Established", "crd", "--all", check=False).returncode
            == 0
        ),
        what="the CRDs established",
    )
    # The kubernetes Service (what the kubelet puts in every pod's KUBERNETES_SERVICE_*) is the
    # address the relay serves.
    svc = get(kubectl, "service", "kubernetes", "-n", "default")
    assert svc["spec"]["clusterIP"] == SERVICE_IP
    assert svc["spec"]["ports"][0]["port"] == SERVICE_PORT
    for doc in _spark_rbac(ns):
        kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(doc))

    topic = f"lake-{uuid.uuid4().hex[:6]}"
    pod_kafka.create_topic(topic, PARTITIONS)
    produced = produce(pod_kafka.bootstrap, topic, ({"id": i} for i in range(RECORDS)))
    table = kube_node.shared_dir / "lake" / name

    config = OperatorConfig(
        resync_seconds=2,
        lag_interval_seconds=2,
        kafka_timeout_seconds=5,
        worker_spark_image=WORKER_SPARK_IMAGE,
        worker_image_pull_policy="Never",
    )
    spark_operator = SparkOperator(
        control_plane.kubeconfig, [ns], service_host=SERVICE_IP, service_port=SERVICE_PORT
    )

    def explain() -> str:
        pods = kubectl("get", "pods", "-n", ns, "-o", "wide", check=False).stdout
        events = kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp", check=False).stdout
        server_log = kubectl(
            "logs", "-n", ns, f"{name}-spark-server", "--tail=40", check=False, timeout=60
        ).stdout
        # An executor that exits says why last (it could not reach the driver, say).
        executor_logs = "".join(
            f"{p['metadata']['name']}:\n"
            + kubectl("logs", "-n", ns, p["metadata"]["name"], "--tail=8", check=False).stdout
            for p in _pods(kubectl, ns, "offtake.dev/spark-role=executor")
        )
        return (
            f"pods:\n{pods}\nevents:\n{events[-3000:]}\nserver log:\n{server_log}\n"
            f"executor logs:\n{executor_logs[-4000:]}\n"
            f"spark-operator log:\n{spark_operator.log_tail(20)}"
        )

    with spark_operator, operator_running(control_plane, config):
        kubectl(
            "apply",
            "-n",
            ns,
            "-f",
            "-",
            input=json.dumps(_pipeline(name, pod_kafka.bootstrap, topic)),
        )
        # Ours: the SparkConnect, its token and the NetworkPolicies.
        sc = wait_for(
            lambda: get(kubectl, "sparkconnects.sparkoperator.k8s.io", f"{name}-spark", "-n", ns),
            what="the pipeline's SparkConnect",
        )
        assert sc["spec"]["image"] == SPARK_IMAGE
        policies = {
            p["metadata"]["name"]: p["spec"]
            for p in get(kubectl, "networkpolicy", "-n", ns)["items"]
        }
        assert set(policies) == {f"{name}-spark-server", f"{name}-spark-executors"}
        # The spark-operator's: the server pod (Spark's driver), which starts the executors.
        server = wait_for(
            lambda: _running(_pods(kubectl, ns, "offtake.dev/spark-role=server")),
            timeout=600,
            what="the Connect server's pod running",
            explain=explain,
        )[0]
        assert server["metadata"]["name"] == f"{name}-spark-server"
        assert (
            server["metadata"]["labels"]["sparkoperator.k8s.io/launched-by-spark-operator"]
            == "true"
        )

        def registered_executors() -> list[dict[str, Any]] | None:
            """The executor pods running and registered with the server (Spark's driver): a
            pod runs before its JVM reaches the driver, and one that cannot reach it exits."""
            found = _running(_pods(kubectl, ns, "offtake.dev/spark-role=executor"))
            if len(found) != EXECUTORS:
                return None
            log = kubectl("logs", "-n", ns, server_name, check=False, timeout=60).stdout
            ids = [p["metadata"]["labels"].get("spark-exec-id") for p in found]
            return found if all(f"with ID {eid}," in log for eid in ids) else None

        server_name = f"{name}-spark-server"
        executors = wait_for(
            registered_executors,
            timeout=600,
            what=f"{EXECUTORS} executor pods running and registered with the server",
            explain=explain,
        )
        for pod in [server, *executors]:
            assert pod["spec"]["nodeName"] == NODE_NAME
            assert pod["spec"]["securityContext"]["runAsUser"] == 185
        for pod in executors:
            owner = pod["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["name"]) == ("Pod", f"{name}-spark-server")
            assert pod["spec"]["automountServiceAccountToken"] is False
        service = get(kubectl, "service", f"{name}-spark-server", "-n", ns)
        assert 15002 in [p["port"] for p in service["spec"]["ports"]]

        url = f"sc://{server['status']['podIP']}:15002"
        token_secret = get(kubectl, "secret", f"{name}-spark-token", "-n", ns)
        token = base64.b64decode(token_secret["data"]["token"]).decode()
        # The server's JVM opens its Connect port once its SparkContext is up.
        wait_for(
            lambda: port_open(url),
            timeout=300,
            what=f"the Connect server listening at {url}",
            explain=explain,
        )
        # From this host, which no NetworkPolicy admits and none here stops: the token does.
        (missing, wrong, right), _ = ask(
            url,
            [("no token", None), ("another pipeline's token", "another-pipelines-token"),
             ("the pipeline's token", token)],
        )  # fmt: skip
        for answer in (missing, wrong):
            assert answer.startswith("REFUSED"), answer
            assert "UNAUTHENTICATED" in answer or "authentication" in answer.lower(), answer
        assert right == "ANSWER 42"

        # The workers: at the server pod's address (no DNS for the Service name), unpaused.
        env = [{"name": "OFFTAKE_SPARK_CONNECT_URL", "value": url}]
        patch(
            kubectl, ns, f"cpl/{name}",
            {"spec": {"paused": False, "template": {"spec": {"env": env}}}},
        )  # fmt: skip
        began = time.monotonic()
        try:
            wait_caught_up(pod_kafka.bootstrap, f"{ns}.{name}", topic, PARTITIONS, timeout=600)
        except AssertionError:
            pytest.fail(explain(), pytrace=False)
        caught_up = round(time.monotonic() - began, 1)
        # The workers' selector (Deployment, Service, PodDisruptionBudget) selects workers
        # only: the Spark operator copies the SparkConnect's labels onto the executors.
        worker_pods = _pods(kubectl, ns, f"offtake.dev/pipeline={name}")
        roles = [p["metadata"]["labels"].get("offtake.dev/spark-role") for p in worker_pods]
        assert worker_pods and roles == [None] * len(worker_pods), roles
        worker_logs = "".join(
            kubectl("logs", "-n", ns, p["metadata"]["name"], check=False, timeout=60).stdout
            for p in worker_pods
        )
        assert f"connecting to Spark Connect at {url}" in worker_logs, worker_logs[-3000:]
        assert token not in worker_logs
        # The executors ran the write's tasks (the server's log names them as it assigns).
        server_log = kubectl("logs", "-n", ns, f"{name}-spark-server", timeout=60).stdout
        executor_ids = {p["metadata"]["labels"].get("spark-exec-id") for p in executors}
        assert executor_ids <= {"1", "2", "3", "4"}, executor_ids
        tasks_on = {eid for eid in executor_ids if f"executor {eid}," in server_log}

    import pyarrow.parquet as pq

    ids = Counter(pq.read_table(table).column("id").to_pylist())
    lost, duplicated = lost_and_duplicated(produced, ids)
    files = sorted(p.name for p in table.rglob("*.parquet"))
    owners = {p.stat().st_uid for p in table.rglob("*.parquet")}
    report(
        "spark-on-kubernetes-node",
        spark_operator=VERSION,
        produced=produced,
        rows_written=sum(ids.values()),
        lost=lost,
        duplicated=duplicated,
        parquet_files=len(files),
        executors=len(executors),
        executors_with_tasks=len(tasks_on),
        caught_up_after_seconds=caught_up,
    )
    assert (lost, duplicated, sum(ids.values())) == (0, 0, produced)
    assert owners == {185}, owners  # written in the pods, by Spark's user
    assert tasks_on == executor_ids, (executor_ids, server_log[-3000:])
