"""The operator end to end against kmock's Kubernetes emulator: kopf, handlers, HTTP client.

One operator serves the whole module (kopf takes seconds to stop); each test works in its own
namespace so the tests stay independent.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from kmock_operator import (
    CONFIGMAPS,
    DEPLOYMENTS,
    HPAS,
    JOBS,
    PDBS,
    PIPELINES,
    SECRETS,
    SERVICES,
    FakeKafka,
    emulator,
    eventually,
    running_operator,
    write_kubeconfig,
)
from operator_testkit import pipeline_body
from support.kube import reconcile_passes

from offtake.redrive import Counts
from offtake_operator import metrics, names
from offtake_operator.context import OperatorContext
from offtake_operator.lag import LagReport
from offtake_operator.settings import OperatorConfig

pytestmark = pytest.mark.asyncio(loop_scope="module")

CONFIG = OperatorConfig(
    worker_image="registry.test/offtake:1",
    resync_seconds=0.5,
    lag_interval_seconds=0.3,
    rewind_poll_seconds=0.2,
)
KAFKA = FakeKafka()


class Cluster:
    """Test-side access to the emulator: plain HTTP for writes, the object store for reads."""

    def __init__(self, server: Any, session: aiohttp.ClientSession, ctx: OperatorContext) -> None:
        self.server = server
        self.session = session
        self.ctx = ctx

    def obj(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        found = self.server.objects[resource, namespace, name]
        return json.loads(json.dumps(found.raw))  # a plain copy, detached from the store

    def exists(self, resource: str, namespace: str, name: str) -> bool:
        try:
            return not self.server.objects[resource, namespace, name].deleted
        except KeyError:
            return False

    def history(self, resource: str, namespace: str, name: str) -> list[Any]:
        return list(self.server.objects[resource, namespace, name].history)

    async def request(self, method: str, path: str, body: Any = None) -> None:
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
        async with self.session.request(method, path, json=body, headers=headers) as resp:
            assert resp.status < 300, await resp.text()

    async def create(self, body: dict[str, Any]) -> None:
        ns = body["metadata"]["namespace"]
        await self.request(
            "POST", f"/apis/offtake.dev/v1alpha1/namespaces/{ns}/consumerpipelines", body
        )

    async def patch_pipeline(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        path = f"/apis/offtake.dev/v1alpha1/namespaces/{namespace}/consumerpipelines/{name}"
        await self.request("PATCH", path, patch)

    def status(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(self.obj(PIPELINES, namespace, name).get("status") or {})

    async def passes(self, namespace: str, name: str, count: int = 3) -> None:
        """Wait until the operator has finished ``count`` more reconcile passes of the
        pipeline: what a check that a resync repeats nothing waits on, not a sleep."""
        check = reconcile_passes(self.ctx, namespace, name, count)
        await eventually(check, timeout=60, what=f"{count} more passes of {namespace}/{name}")

    def condition(self, namespace: str, name: str, ctype: str) -> dict[str, Any]:
        conditions = self.status(namespace, name).get("conditions", [])
        return dict(next(c for c in conditions if c["type"] == ctype))

    def events(self, namespace: str) -> list[dict[str, Any]]:
        # kmock cannot create objects by generateName (kopf's Events use it), so the operator's
        # own record of what it posted stands in for listing Events.
        return [
            {"type": e.type, "reason": e.reason, "message": e.message}
            for (ns, _), e in list(self.ctx.recent_events)
            if ns == namespace
        ]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    kubeconfig = tmp_path_factory.mktemp("kube") / "kubeconfig"
    with pytest.MonkeyPatch.context() as mp:
        async with emulator() as server:
            write_kubeconfig(kubeconfig, str(server.url))
            mp.setenv("KUBECONFIG", str(kubeconfig))
            async with (
                aiohttp.ClientSession(base_url=str(server.url)) as session,
                running_operator(KAFKA, CONFIG) as ctx,
            ):
                yield Cluster(server, session, ctx)


@pytest_asyncio.fixture(loop_scope="module")
async def ns(cluster: Cluster) -> AsyncIterator[str]:
    """A fresh namespace; its pipelines are deleted afterwards so they stop costing resyncs."""
    KAFKA.members = 0
    KAFKA.resets.clear()
    KAFKA.dlq_totals.clear()
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    yield namespace
    for (res, ns_, name), obj in list(cluster.server.objects.items()):
        if res.plural == "consumerpipelines" and ns_ == namespace and not obj.deleted:
            await cluster.request(
                "DELETE", f"/apis/offtake.dev/v1alpha1/namespaces/{ns_}/consumerpipelines/{name}"
            )
            # The operator's finalizer (kopf's, for the per-pipeline daemon) must be released.
            await eventually(
                lambda r=res, s=ns_, n=name: cluster.server.objects[r, s, n].deleted,
                what=f"{name} gone",
            )


async def test_create_renders_every_child_with_owner_references(cluster: Cluster, ns: str) -> None:
    await cluster.create(pipeline_body("orders", namespace=ns, replicas=2))
    children = [
        (CONFIGMAPS, "orders-pipeline"),
        (DEPLOYMENTS, "orders"),
        (SERVICES, "orders-metrics"),
        (PDBS, "orders"),
    ]
    for resource, name in children:
        obj = await eventually(
            lambda r=resource, n=name: cluster.obj(r, ns, n), what=f"{resource} {name}"
        )
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (
            ref["uid"] == "uid-1"
            and ref["kind"] == "ConsumerPipeline"
            and ref["controller"] is True
        )
        assert obj["metadata"]["labels"][names.PIPELINE_LABEL] == "orders"
    dep = cluster.obj(DEPLOYMENTS, ns, "orders")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.test/offtake:1"
    status = await eventually(
        lambda: cluster.status(ns, "orders").get("phase") and cluster.status(ns, "orders")
    )
    assert status["selector"] == "offtake.dev/pipeline=orders"
    assert status["observedGeneration"] == 1
    assert status["phase"] == "Pending"  # no worker is ready: nothing runs pods here
    assert cluster.condition(ns, "orders", "Ready")["status"] == "False"
    assert not cluster.exists(HPAS, ns, "orders")


async def test_readiness_of_the_deployment_shows_in_status(cluster: Cluster, ns: str) -> None:
    await cluster.create(pipeline_body("orders", namespace=ns, replicas=2))
    await eventually(lambda: cluster.obj(DEPLOYMENTS, ns, "orders"))
    # What the deployment controller would report once both workers pass /readyz.
    await cluster.request(
        "PATCH",
        f"/apis/apps/v1/namespaces/{ns}/deployments/orders/status",
        {
            "status": {
                "replicas": 2,
                "readyReplicas": 2,
                "updatedReplicas": 2,
                "availableReplicas": 2,
            },
        },
    )
    await eventually(
        lambda: cluster.status(ns, "orders")["phase"] == "Running", what="phase Running"
    )
    status = cluster.status(ns, "orders")
    assert status["readyReplicas"] == 2 and status["replicas"] == 2
    ready = cluster.condition(ns, "orders", "Ready")
    assert ready["status"] == "True" and ready["reason"] == "WorkersReady"
    await eventually(
        lambda: any(e["reason"] == "Running" for e in cluster.events(ns)), what="a Running event"
    )


async def test_spec_change_changes_the_config_checksum(cluster: Cluster, ns: str) -> None:
    await cluster.create(pipeline_body("orders", namespace=ns))

    def checksum() -> str:
        dep = cluster.obj(DEPLOYMENTS, ns, "orders")
        return str(dep["spec"]["template"]["metadata"]["annotations"][names.CHECKSUM_ANNOTATION])

    first = await eventually(checksum)
    await cluster.patch_pipeline(
        ns, "orders", {"metadata": {"generation": 2}, "spec": {"commit": {"intervalSeconds": 7}}}
    )
    await eventually(lambda: checksum() != first, what="a new checksum")
    cm = cluster.obj(CONFIGMAPS, ns, "orders-pipeline")
    assert "intervalSeconds: 7" in cm["data"]["pipeline.yaml"]
    await eventually(lambda: cluster.status(ns, "orders")["observedGeneration"] == 2)


async def test_pause_scales_to_zero_and_resume_scales_back(cluster: Cluster, ns: str) -> None:
    await cluster.create(pipeline_body("orders", namespace=ns, replicas=3))
    await eventually(lambda: cluster.obj(DEPLOYMENTS, ns, "orders")["spec"]["replicas"] == 3)
    await cluster.patch_pipeline(ns, "orders", {"spec": {"paused": True}})
    await eventually(
        lambda: cluster.obj(DEPLOYMENTS, ns, "orders")["spec"]["replicas"] == 0, what="0 replicas"
    )
    await eventually(lambda: cluster.status(ns, "orders")["phase"] == "Paused", what="phase Paused")
    assert cluster.condition(ns, "orders", "Ready")["reason"] == "Paused"
    await cluster.patch_pipeline(ns, "orders", {"spec": {"paused": False}})
    await eventually(
        lambda: cluster.obj(DEPLOYMENTS, ns, "orders")["spec"]["replicas"] == 3, what="3 replicas"
    )
    await eventually(lambda: cluster.status(ns, "orders")["phase"] == "Pending")
    reasons = {e["reason"] for e in cluster.events(ns)}
    assert {"Paused", "Scaled"} <= reasons


async def test_invalid_spec_degrades_and_leaves_the_deployment_alone(
    cluster: Cluster, ns: str
) -> None:
    await cluster.create(pipeline_body("orders", namespace=ns, replicas=2))
    await eventually(lambda: cluster.status(ns, "orders").get("phase"))
    before = cluster.obj(DEPLOYMENTS, ns, "orders")
    versions = len(cluster.history(DEPLOYMENTS, ns, "orders"))
    # Passes a lax schema but not the worker's loader: an unknown (misspelt) field.
    await cluster.patch_pipeline(
        ns, "orders", {"metadata": {"generation": 2}, "spec": {"limits": {"maxInFlightMesages": 5}}}
    )
    await eventually(
        lambda: cluster.status(ns, "orders")["phase"] == "Degraded", what="phase Degraded"
    )
    degraded = cluster.condition(ns, "orders", "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec"
    assert "spec.limits.maxInFlightMesages: unknown field" in degraded["message"]
    warnings = await eventually(
        lambda: [e for e in cluster.events(ns) if e["type"] == "Warning"], what="a Warning"
    )
    assert any("maxInFlightMesages" in e["message"] for e in warnings)
    # Resyncs keep running (and the operator keeps living), and the Deployment stays as it was.
    await eventually(lambda: cluster.status(ns, "orders")["observedGeneration"] == 2)
    assert cluster.obj(DEPLOYMENTS, ns, "orders") == before
    assert len(cluster.history(DEPLOYMENTS, ns, "orders")) == versions
    # Fixing the spec heals it.
    await cluster.patch_pipeline(
        ns, "orders", {"metadata": {"generation": 3}, "spec": {"limits": None}}
    )
    await eventually(lambda: cluster.status(ns, "orders")["phase"] == "Pending", what="healed")
    assert cluster.condition(ns, "orders", "Degraded")["status"] == "False"


async def test_drift_is_repaired(cluster: Cluster, ns: str) -> None:
    await cluster.create(pipeline_body("orders", namespace=ns, replicas=2))
    await eventually(lambda: cluster.obj(DEPLOYMENTS, ns, "orders"))
    await eventually(lambda: cluster.obj(CONFIGMAPS, ns, "orders-pipeline"))
    await cluster.request(
        "PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/orders", {"spec": {"replicas": 9}}
    )
    await cluster.request("DELETE", f"/api/v1/namespaces/{ns}/configmaps/orders-pipeline")
    await eventually(
        lambda: cluster.obj(DEPLOYMENTS, ns, "orders")["spec"]["replicas"] == 2,
        what="replicas back",
    )
    await eventually(
        lambda: cluster.exists(CONFIGMAPS, ns, "orders-pipeline"), what="ConfigMap back"
    )


async def test_lag_reaches_status(cluster: Cluster, ns: str) -> None:
    KAFKA.lag_report = LagReport(lag=1200, lag_seconds=4.2, partitions=6)
    await cluster.create(pipeline_body("orders", namespace=ns))
    await eventually(lambda: cluster.status(ns, "orders").get("lag") == 1200, what="lag in status")
    status = cluster.status(ns, "orders")
    assert status["lagSeconds"] == 4.2 and status["partitions"] == 6


async def test_queue_mode_leaves_lag_out_of_status_rather_than_a_wrong_number(
    cluster: Cluster, ns: str
) -> None:
    """A share group has no committed offsets: measure_lag reports none (None), and the lag
    last written (here from before the switch to queue mode) is removed, not kept stale."""
    KAFKA.lag_report = LagReport(lag=1200, lag_seconds=4.2, partitions=2)
    await cluster.create(pipeline_body("jobs", namespace=ns))
    await eventually(lambda: cluster.status(ns, "jobs").get("lag") == 1200, what="lag in status")
    KAFKA.lag_report = LagReport(lag=None, lag_seconds=None, partitions=2)
    await cluster.patch_pipeline(ns, "jobs", {"spec": {"source": {"groupType": "share"}}})
    await eventually(
        lambda: "lag" not in cluster.status(ns, "jobs"), what="lag left out in queue mode"
    )
    status = cluster.status(ns, "jobs")
    assert "lagSeconds" not in status and status["partitions"] == 2


async def test_autoscaling_makes_an_hpa_capped_at_the_partitions(cluster: Cluster, ns: str) -> None:
    KAFKA.lag_report = LagReport(lag=0, lag_seconds=0.0, partitions=4)
    await cluster.create(
        pipeline_body(
            "orders",
            namespace=ns,
            autoscaling={
                "enabled": True,
                "minReplicas": 2,
                "maxReplicas": 10,
                "targetLagPerReplica": 100,
            },
        )
    )
    hpa = await eventually(
        lambda: (
            cluster.obj(HPAS, ns, "orders")["spec"]["maxReplicas"] == 4
            and cluster.obj(HPAS, ns, "orders")
        ),
        what="an HPA capped at 4",
    )
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "ConsumerPipeline"
    assert hpa["spec"]["minReplicas"] == 2
    await eventually(
        lambda: cluster.status(ns, "orders").get("autoscaler") == "HorizontalPodAutoscaler"
    )
    await cluster.patch_pipeline(ns, "orders", {"spec": {"autoscaling": {"enabled": False}}})
    await eventually(lambda: not cluster.exists(HPAS, ns, "orders"), what="the HPA removed")


async def test_autoscaling_in_queue_mode_is_not_capped_at_the_partitions(
    cluster: Cluster, ns: str
) -> None:
    """source.groupType share: every worker gets records of every partition, so more workers
    than partitions all work and the autoscaler may go past the partition count."""
    KAFKA.lag_report = LagReport(lag=0, lag_seconds=0.0, partitions=2)
    await cluster.create(
        pipeline_body(
            "orders",
            namespace=ns,
            source={"topics": ["orders"], "groupType": "share"},
            autoscaling={"enabled": True, "maxReplicas": 6, "targetLagSeconds": 30},
        )
    )
    await eventually(lambda: cluster.status(ns, "orders").get("partitions") == 2)
    # A pass after the partitions are known: the HPA is rendered again, still uncapped.
    await cluster.patch_pipeline(ns, "orders", {"spec": {"autoscaling": {"maxReplicas": 7}}})
    await eventually(
        lambda: cluster.obj(HPAS, ns, "orders")["spec"]["maxReplicas"] == 7,
        what="an HPA up to 7 workers on 2 partitions",
    )


async def test_rewind_stops_workers_waits_for_an_empty_group_and_runs_once(
    cluster: Cluster, ns: str
) -> None:
    await cluster.create(
        pipeline_body(
            "orders", namespace=ns, replicas=2, source={"topics": ["orders"], "groupId": f"{ns}.g1"}
        )
    )
    await eventually(lambda: cluster.obj(DEPLOYMENTS, ns, "orders")["spec"]["replicas"] == 2)
    KAFKA.members = 2  # the workers are still in the group
    await cluster.patch_pipeline(ns, "orders", {"spec": {"rewind": {"to": "earliest", "id": "r1"}}})
    await eventually(
        lambda: cluster.obj(DEPLOYMENTS, ns, "orders")["spec"]["replicas"] == 0,
        what="workers stopped",
    )
    await eventually(
        lambda: f"waiting for group {ns}.g1" in cluster.status(ns, "orders").get("message", "")
    )
    assert cluster.status(ns, "orders")["rewind"]["activeId"] == "r1"
    assert KAFKA.resets == []  # never while the group has members
    KAFKA.members = 0  # they have left
    await eventually(
        lambda: cluster.status(ns, "orders").get("rewind", {}).get("lastId") == "r1",
        what="rewind done",
    )
    assert [(g, r.id, r.to) for g, r in KAFKA.resets] == [(f"{ns}.g1", "r1", "earliest")]
    await eventually(
        lambda: cluster.obj(DEPLOYMENTS, ns, "orders")["spec"]["replicas"] == 2, what="workers back"
    )
    assert "activeId" not in cluster.status(ns, "orders")["rewind"]
    await eventually(lambda: "RewindCompleted" in [e["reason"] for e in cluster.events(ns)])
    assert "RewindStarted" in [e["reason"] for e in cluster.events(ns)]
    # Resyncs (every 0.5 s here) do not repeat it.
    await cluster.passes(ns, "orders")
    assert len(KAFKA.resets) == 1


async def test_a_strimzi_kafkauser_secret_is_mounted_as_properties(
    cluster: Cluster, ns: str
) -> None:
    spec = {"kafka": {"bootstrapServers": "k:9093", "secretRef": {"name": "orders-user"}}}
    await cluster.create(pipeline_body("orders", namespace=ns, **spec))
    # The Secret does not exist yet: Degraded, naming it, and no workers.
    await eventually(lambda: cluster.status(ns, "orders").get("phase") == "Degraded")
    degraded = cluster.condition(ns, "orders", "Degraded")
    assert f"Secret {ns}/orders-user not found" in degraded["message"]
    assert not cluster.exists(DEPLOYMENTS, ns, "orders")
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="orders-user" password="pw-123";'
    )
    data = {"password": "pw-123", "sasl.jaas.config": jaas}
    await cluster.request(
        "POST",
        f"/api/v1/namespaces/{ns}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "orders-user", "namespace": ns},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        },
    )
    assert cluster.exists(SECRETS, ns, "orders-user")
    dep = await eventually(lambda: cluster.obj(DEPLOYMENTS, ns, "orders"), what="deployment")
    volume = next(
        v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "kafka-secret"
    )
    assert volume["secret"]["items"] == [{"key": "password", "path": "sasl.password"}]
    config = cluster.obj(CONFIGMAPS, ns, "orders-pipeline")["data"]["pipeline.yaml"]
    assert "sasl.username: orders-user" in config and "pw-123" not in config
    await eventually(lambda: cluster.status(ns, "orders")["phase"] == "Pending", what="healed")
    assert "pw-123" not in json.dumps(cluster.status(ns, "orders"))
    # The operator's own series counted both kinds of pass.
    for result in ("invalid", "ok"):
        count = metrics.REGISTRY.get_sample_value(
            "offtake_operator_reconciles_total", {"result": result}
        )
        assert count is not None and count > 0, result
    assert metrics.REGISTRY.get_sample_value("offtake_operator_reconcile_duration_seconds_count")


UNTIL = "2026-05-01T12:00:00Z"


async def test_redrive_runs_a_job_once_and_records_what_it_replayed(
    cluster: Cluster, ns: str
) -> None:
    spec = {
        "replicas": 2,
        "source": {"topics": ["orders"], "groupId": f"{ns}.g1"},
        "errors": {"policy": "dlq", "dlq": {"topic": "orders.dlq"}},
        "redrive": {"id": "r1", "until": UNTIL},
    }
    await cluster.create(pipeline_body("orders", namespace=ns, **spec))
    # The dead-letter topic does not exist yet: the field is named, no Job, workers unaffected.
    await eventually(
        lambda: (
            "spec.redrive.from: the dead-letter topic 'orders.dlq' does not exist"
            in cluster.status(ns, "orders")["redrive"]["message"]
        ),
        what="missing DLQ named",
    )
    assert not cluster.exists(JOBS, ns, "orders-redrive")
    assert cluster.obj(DEPLOYMENTS, ns, "orders")["spec"]["replicas"] == 2
    warnings = await eventually(
        lambda: [e for e in cluster.events(ns) if e["reason"] == "RedriveFailed"], what="warning"
    )
    assert len(warnings) == 1 and "spec.redrive.from" in warnings[0]["message"]

    KAFKA.dlq_totals["orders.dlq"] = Counts()
    job = await eventually(lambda: cluster.obj(JOBS, ns, "orders-redrive"), what="redrive Job")
    assert job["metadata"]["ownerReferences"][0]["kind"] == "ConsumerPipeline"
    assert job["metadata"]["annotations"][names.REDRIVE_ID_ANNOTATION] == "r1"
    pod = job["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "registry.test/offtake:1"
    assert container["command"] == ["offtake"]
    assert container["args"] == [
        "redrive",
        "--pipeline",
        names.PIPELINE_PATH,
        "--id",
        "r1",
        "--from",
        "orders.dlq",
        "--until",
        UNTIL,
        "--group",
        f"{ns}.g1.redrive",
    ]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["restartPolicy"] == "Never"
    assert names.PIPELINE_LABEL not in pod["metadata"]["labels"], "not a worker pod"
    await eventually(
        lambda: "RedriveStarted" in [e["reason"] for e in cluster.events(ns)], what="started"
    )
    status = cluster.status(ns, "orders")["redrive"]
    assert status["activeId"] == "r1" and "lastId" not in status
    # The workers keep running: they consume what the redrive replays.
    assert cluster.obj(DEPLOYMENTS, ns, "orders")["spec"]["replicas"] == 2

    KAFKA.dlq_totals["orders.dlq"] = Counts(replayed=5, left=2, skipped=1)
    await cluster.request(
        "PATCH",
        f"/apis/batch/v1/namespaces/{ns}/jobs/orders-redrive",
        {"status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}},
    )
    await eventually(
        lambda: cluster.status(ns, "orders")["redrive"].get("lastId") == "r1", what="recorded"
    )
    status = cluster.status(ns, "orders")["redrive"]
    assert (status["replayed"], status["left"], status["skipped"]) == (5, 2, 1)
    assert status["from"] == "orders.dlq" and status["until"] == UNTIL
    assert status["completedAt"] and "activeId" not in status
    assert "replayed 5 dead letter(s)" in status["message"]
    completed = await eventually(
        lambda: [e for e in cluster.events(ns) if e["reason"] == "RedriveCompleted"]
    )
    assert len(completed) == 1
    # Resyncs do not run it again.
    await cluster.passes(ns, "orders")
    assert len(cluster.history(JOBS, ns, "orders-redrive")) >= 1
    assert (
        cluster.obj(JOBS, ns, "orders-redrive")["metadata"]["annotations"][
            names.REDRIVE_ID_ANNOTATION
        ]
        == "r1"
    )
    assert len([e for e in cluster.events(ns) if e["reason"] == "RedriveCompleted"]) == 1

    # A new id: the finished Job makes way for the new one.
    await cluster.patch_pipeline(ns, "orders", {"spec": {"redrive": {"id": "r2", "until": UNTIL}}})
    await eventually(
        lambda: (
            cluster.obj(JOBS, ns, "orders-redrive")["metadata"]["annotations"][
                names.REDRIVE_ID_ANNOTATION
            ]
            == "r2"
        ),
        what="the Job of r2",
    )
    assert cluster.status(ns, "orders")["redrive"]["activeId"] == "r2"
    assert cluster.status(ns, "orders")["redrive"]["lastId"] == "r1"


async def test_a_failed_redrive_job_is_reported(cluster: Cluster, ns: str) -> None:
    KAFKA.dlq_totals["dlq"] = Counts()
    spec = {"redrive": {"id": "x", "from": "dlq", "until": UNTIL}}
    await cluster.create(pipeline_body("orders", namespace=ns, **spec))
    await eventually(lambda: cluster.obj(JOBS, ns, "orders-redrive"), what="redrive Job")
    await cluster.request(
        "PATCH",
        f"/apis/batch/v1/namespaces/{ns}/jobs/orders-redrive",
        {
            "status": {
                "conditions": [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "BackoffLimitExceeded",
                        "message": "Job has reached the specified backoff limit",
                    }
                ]
            }
        },
    )
    await eventually(
        lambda: "failed: BackoffLimitExceeded" in cluster.status(ns, "orders")["redrive"]["message"]
    )
    assert "lastId" not in cluster.status(ns, "orders")["redrive"]
    failed = await eventually(
        lambda: [e for e in cluster.events(ns) if e["reason"] == "RedriveFailed"], what="warning"
    )
    await cluster.passes(ns, "orders")  # resyncs do not repeat it
    failed = [e for e in cluster.events(ns) if e["reason"] == "RedriveFailed"]
    assert len(failed) == 1 and "BackoffLimitExceeded" in failed[0]["message"]


async def test_an_unparsable_redrive_until_degrades_naming_the_field(
    cluster: Cluster, ns: str
) -> None:
    await cluster.create(pipeline_body("orders", namespace=ns, replicas=2))
    await eventually(lambda: cluster.obj(DEPLOYMENTS, ns, "orders")["spec"]["replicas"] == 2)
    await cluster.patch_pipeline(
        ns, "orders", {"spec": {"redrive": {"id": "r1", "from": "dlq", "until": "yesterday"}}}
    )
    await eventually(lambda: cluster.status(ns, "orders").get("phase") == "Degraded")
    degraded = cluster.condition(ns, "orders", "Degraded")
    assert degraded["reason"] == "InvalidSpec"
    assert degraded["message"].startswith("spec.redrive.until: expected an RFC 3339 timestamp")
    assert not cluster.exists(JOBS, ns, "orders-redrive")
    assert cluster.obj(DEPLOYMENTS, ns, "orders")["spec"]["replicas"] == 2


async def test_another_teams_hpa_and_job_under_a_childs_name_are_neither_changed_nor_deleted(
    cluster: Cluster, ns: str
) -> None:
    """Issue 23 item 3 for the children made later in a pass (the real API server and garbage
    collector: tests/e2e/test_operator_ownership.py): an HPA and a Job named like the
    pipeline's, made by someone else, are reported NameTaken and never written or deleted (the
    redrive deleted any Job of another id under its name before)."""
    team = {"name": "orders", "namespace": ns, "labels": {"app.kubernetes.io/managed-by": "Helm"}}
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": team,
        "spec": {"maxReplicas": 3, "scaleTargetRef": {"kind": "Deployment", "name": "web"}},
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {**team, "name": "orders-redrive"},
        "spec": {"template": {"spec": {"containers": [{"name": "m", "image": "team/migrate"}]}}},
    }
    await cluster.request(
        "POST", f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers", hpa
    )
    await cluster.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", job)
    KAFKA.dlq_totals["dlq"] = Counts()
    scaling = {"enabled": True, "minReplicas": 1, "maxReplicas": 4, "targetLagPerReplica": 100}
    spec = {"autoscaling": scaling, "redrive": {"id": "r1", "from": "dlq", "until": UNTIL}}
    await cluster.create(pipeline_body("orders", namespace=ns, **spec))

    def taken(what: str) -> dict[str, Any] | None:
        conditions = cluster.status(ns, "orders").get("conditions") or []
        degraded = next((c for c in conditions if c["type"] == "Degraded"), {})
        return (
            degraded if degraded["reason"] == "NameTaken" and what in degraded["message"] else None
        )

    hpa_named = f"HorizontalPodAutoscaler {ns}/orders"
    await eventually(lambda: taken(hpa_named), timeout=30, what="HPA named")
    assert cluster.condition(ns, "orders", "Ready")["reason"] == "NameTaken"
    # Posted just after the status is written: waited for too.
    await eventually(
        lambda: [
            e
            for e in cluster.events(ns)
            if e["reason"] == "NameTaken" and hpa_named in e["message"]
        ],
        what="a NameTaken Warning naming the HPA",
    )
    # The team removes its HPA: the pipeline makes its own; then the Job's name is in the way.
    await cluster.request(
        "DELETE", f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/orders"
    )
    await eventually(lambda: taken(f"Job {ns}/orders-redrive"), timeout=30, what="Job named")
    own = cluster.obj(HPAS, ns, "orders")
    assert own["metadata"]["ownerReferences"][0]["kind"] == "ConsumerPipeline"
    await cluster.passes(ns, "orders")  # resyncs (every 0.5 s) go by: the Job is untouched
    assert cluster.exists(JOBS, ns, "orders-redrive")
    assert len(cluster.history(JOBS, ns, "orders-redrive")) == 1
    assert "ownerReferences" not in cluster.obj(JOBS, ns, "orders-redrive")["metadata"]


async def test_a_kafka_secret_key_that_runs_a_command_degrades_the_pipeline_naming_it(
    cluster: Cluster, ns: str
) -> None:
    """A tenant's Secret may carry sasl.* and ssl.* properties, but not the kinit command: the
    operator's own clients would run it. Degraded, naming the key; no workers, no value shown."""
    data = {"sasl.username": "u", "sasl.kerberos.kinit.cmd": "touch /tmp/pwned-by-tenant"}
    await cluster.request(
        "POST",
        f"/api/v1/namespaces/{ns}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "kerberos", "namespace": ns},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        },
    )
    spec = {"kafka": {"bootstrapServers": "k:9093", "secretRef": {"name": "kerberos"}}}
    await cluster.create(pipeline_body("orders", namespace=ns, **spec))
    await eventually(lambda: cluster.status(ns, "orders").get("phase") == "Degraded")
    message = cluster.condition(ns, "orders", "Degraded")["message"]
    assert "'sasl.kerberos.kinit.cmd' is refused" in message and "pwned" not in message
    assert not cluster.exists(DEPLOYMENTS, ns, "orders")


async def test_a_group_id_outside_the_namespace_fails_naming_the_field(
    cluster: Cluster, ns: str
) -> None:
    """groupId names a group across the Kafka cluster: a pipeline that names another
    namespace's group (here the default group of pipeline "orders" in namespace "shop") gets
    no workers and an InvalidSpec condition naming spec.source.groupId; renamed into its own
    namespace it runs."""
    source = {"topics": ["orders"], "groupId": "shop.orders"}
    await cluster.create(pipeline_body("thief", namespace=ns, source=source))
    await eventually(lambda: cluster.status(ns, "thief").get("phase") == "Degraded")
    degraded = cluster.condition(ns, "thief", "Degraded")
    assert degraded["reason"] == "InvalidSpec"
    assert degraded["message"].startswith(
        f"spec.source.groupId: 'shop.orders' must start with '{ns}.'"
    )
    assert not cluster.exists(DEPLOYMENTS, ns, "thief")
    assert not cluster.exists(CONFIGMAPS, ns, "thief-pipeline")
    await cluster.patch_pipeline(ns, "thief", {"spec": {"source": {"groupId": f"{ns}.orders"}}})
    await eventually(lambda: cluster.exists(DEPLOYMENTS, ns, "thief"), what="the Deployment")
    await eventually(
        lambda: cluster.condition(ns, "thief", "Degraded")["status"] == "False", what="healed"
    )
