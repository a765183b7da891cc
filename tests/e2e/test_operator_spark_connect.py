"""submit.mode kubernetes on a real API server with the Kubeflow Spark operator's own
SparkConnect CRD (from its Go module, testbed/offtake_testbed/spark_operator.py): the
operator makes the pipeline's SparkConnect, which the API server validates against that
schema; then the worker, run from the ConfigMap the operator wrote with the environment of the
Deployment's worker container, writes every record once through a Spark Connect server (the
one in the pyspark wheel) standing in for the one the Spark operator would run. There is no
kubelet, so no pod runs: the worker is a local process, as in the other e2e tests."""

from __future__ import annotations

import base64
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.kube import consumer_pipeline, get, operator_running, patch, wait_for
from support.reports import lost_and_duplicated, report
from support.servers import started
from support.workers import WorkerProcess, produce, wait_caught_up

from offtake_testbed.kube import ControlPlane
from offtake_testbed.pytest_plugin import TopicFactory
from offtake_testbed.pytest_plugin_kube import Kubectl
from offtake_testbed.spark_operator import CRD_NAME, VERSION, spark_connect_crd

os.environ.setdefault("OFFTAKE_TICK_SECONDS", "1")

from offtake_operator import names
from offtake_operator.settings import OperatorConfig

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 3000


@pytest.fixture
def operator(control_plane: ControlPlane) -> Iterator[None]:
    control_plane.kubectl("apply", "-f", str(ROOT / "crds" / "consumerpipeline.yaml"))
    control_plane.kubectl("apply", "-f", str(spark_connect_crd()))
    for crd in ("consumerpipelines.offtake.dev", CRD_NAME):
        control_plane.kubectl("wait", "--for=condition=Established", f"crd/{crd}")
    config = OperatorConfig(resync_seconds=2, lag_interval_seconds=1, kafka_timeout_seconds=5)
    with operator_running(control_plane, config):
        yield


def connect_server(token: str) -> Any:
    from spark.connect_server import ConnectServer

    return ConnectServer(
        conf={"spark.sql.shuffle.partitions": "2"},
        env={"SPARK_CONNECT_AUTHENTICATE_TOKEN": token},
    )


def pipeline(name: str, bootstrap: str, topic: str, table: Path) -> str:
    return yaml.safe_dump(
        consumer_pipeline(
            name,
            {
                "kafka": {"bootstrapServers": bootstrap},
                "source": {"topics": [topic]},  # the default groupId: <namespace>.<name>
                "sink": {
                    "spark": {
                        "format": "parquet",
                        "path": str(table),
                        "batch": {"maxRecords": 1000, "maxIntervalSeconds": 2},
                        "submit": {
                            "mode": "kubernetes",
                            "image": "registry.example/spark:4.3.0-offtake",
                            "serviceAccount": "spark",
                            "server": {"cores": 2, "memory": "3g"},
                            "executors": {"instances": 3, "cores": 1, "memory": "1g"},
                            "conf": {"spark.sql.shuffle.partitions": "2"},
                        },
                    }
                },
                "commit": {"intervalSeconds": 0.5},
            },
        )
    )


def test_operator_makes_the_spark_connect_server_and_the_worker_writes_through_it(
    kubectl: Kubectl,
    kube_namespace: str,
    kafka_broker: Any,
    topic_factory: TopicFactory,
    operator: None,
    tmp_path: Path,
) -> None:
    ns, name = kube_namespace, "lake"
    topic = topic_factory(partitions=2)
    table = tmp_path / "table"
    kubectl(
        "apply", "-n", ns, "-f", "-", input=pipeline(name, kafka_broker.bootstrap, topic, table)
    )
    owner = get(kubectl, "cpl", name, "-n", ns)
    sc = wait_for(
        lambda: get(kubectl, "sparkconnects.sparkoperator.k8s.io", f"{name}-spark", "-n", ns),
        what="the pipeline's SparkConnect",
    )
    ref = sc["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["name"], ref["uid"]) == (
        "ConsumerPipeline",
        name,
        owner["metadata"]["uid"],
    )
    assert ref["controller"] is True
    spec = sc["spec"]
    assert spec["image"] == "registry.example/spark:4.3.0-offtake"
    assert spec["sparkVersion"] == "4.3.0"
    assert spec["server"]["cores"] == 2 and spec["server"]["memory"] == "3g"
    assert (spec["executor"]["instances"], spec["executor"]["cores"]) == (3, 1)
    assert spec["executor"]["memory"] == "1g"
    for part in (spec["server"], spec["executor"]):
        assert part["template"]["spec"]["serviceAccountName"] == "spark"
    assert spec["sparkConf"]["spark.sql.shuffle.partitions"] == "2"
    # Locked to the pipeline: restricted pods, the server's token from the operator's Secret.
    server_pod = spec["server"]["template"]["spec"]
    assert server_pod["securityContext"]["runAsNonRoot"] is True
    (server_container,) = server_pod["containers"]
    assert server_container["env"] == [
        {
            "name": "SPARK_CONNECT_AUTHENTICATE_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": f"{name}-spark-token", "key": "token"}},
        }
    ]
    assert spec["executor"]["template"]["spec"]["automountServiceAccountToken"] is False
    secret = wait_for(
        lambda: get(kubectl, "secret", f"{name}-spark-token", "-n", ns), what="the token Secret"
    )
    assert secret["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) >= 32
    policy = get(kubectl, "networkpolicy", f"{name}-spark-server", "-n", ns)
    assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 15002}]
    assert get(kubectl, "networkpolicy", f"{name}-spark-executors", "-n", ns)

    # The workers are told where the server's Service is.
    deployment = wait_for(
        lambda: get(kubectl, "deployment", names.deployment_name(name), "-n", ns),
        what="the workers' Deployment",
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["OFFTAKE_SPARK_CONNECT_URL"] == f"sc://{name}-spark-server.{ns}.svc:15002"
    assert {e["name"]: e for e in container["env"]}["OFFTAKE_SPARK_CONNECT_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": f"{name}-spark-token", "key": "token"}
    }

    # The worker as its pod would run it: the ConfigMap's pipeline, the container's
    # environment, but the Connect server's address that of the stand-in.
    cm = get(kubectl, "configmap", names.configmap_name(name), "-n", ns)
    manifest = tmp_path / "pipeline.yaml"
    manifest.write_text(cm["data"][names.CONFIG_KEY])
    produced = produce(kafka_broker.bootstrap, topic, ({"id": i} for i in range(RECORDS)))
    # The stand-in server requires the Secret's token, as the SparkConnect's server would; the
    # worker has it as its secretKeyRef would set it.
    with started(connect_server(token), RuntimeError) as server:
        worker = WorkerProcess(
            manifest,
            tmp_path / "worker.log",
            env={"OFFTAKE_SPARK_CONNECT_URL": server.url, "OFFTAKE_SPARK_CONNECT_TOKEN": token},
        ).start()
        began = time.monotonic()
        try:
            wait_caught_up(kafka_broker.bootstrap, f"{ns}.{name}", topic, 2, timeout=240)
        finally:
            code = worker.terminate()
    assert code == 0, worker.output()[-4000:]
    assert f"connecting to Spark Connect at {server.url}" in worker.output()
    assert token not in worker.output()
    import pyarrow.parquet as pq

    ids = Counter(pq.read_table(table).column("id").to_pylist())
    lost, duplicated = lost_and_duplicated(produced, ids)
    report(
        "spark-kubernetes-mode",
        spark_operator=VERSION,
        produced=produced,
        rows_written=sum(ids.values()),
        lost=lost,
        duplicated=duplicated,
        caught_up_after_seconds=round(time.monotonic() - began, 1),
    )
    assert (lost, duplicated, sum(ids.values())) == (0, 0, produced)

    # Back to local mode: the operator deletes the SparkConnect it owned.
    local = {"mode": "local", "master": "local[1]"}
    patch(
        kubectl, ns, f"cpl/{name}",
        [{"op": "replace", "path": "/spec/sink/spark/submit", "value": local}], kind="json",
    )  # fmt: skip
    wait_for(
        lambda: (
            kubectl(
                "get", "sparkconnects.sparkoperator.k8s.io", "-n", ns, "-o", "name"
            ).stdout.strip()
            == ""
        ),
        what="the SparkConnect removed",
    )
