"""Autoscaling and monitoring objects on a real API server: an HPA capped at the real partition
count, and the ServiceMonitor and KEDA ScaledObject once those CRDs exist in the cluster."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.kube import consumer_pipeline, exists, get, operator_running, patch, wait_for

from offtake_testbed.kube import ControlPlane
from offtake_testbed.pytest_plugin import TopicFactory
from offtake_testbed.pytest_plugin_kube import Kubectl

os.environ.setdefault("OFFTAKE_TICK_SECONDS", "1")

from offtake_operator.settings import OperatorConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]

# Just enough of the Prometheus Operator's and KEDA's CRDs for the API server to serve them.
OPTIONAL_CRDS = [
    ("monitoring.coreos.com", "servicemonitors", "ServiceMonitor", "v1"),
    ("monitoring.coreos.com", "prometheusrules", "PrometheusRule", "v1"),
    ("keda.sh", "scaledobjects", "ScaledObject", "v1alpha1"),
    ("keda.sh", "triggerauthentications", "TriggerAuthentication", "v1alpha1"),
]


def crd(group: str, plural: str, kind: str, version: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture
def operator(control_plane: ControlPlane) -> Iterator[None]:
    """A fresh operator per test: it learns which optional APIs exist when it starts."""
    control_plane.kubectl("apply", "-f", str(ROOT / "crds" / "consumerpipeline.yaml"))
    control_plane.kubectl(
        "wait", "--for=condition=Established", "crd/consumerpipelines.offtake.dev"
    )
    config = OperatorConfig(
        resync_seconds=2,
        lag_interval_seconds=1,
        kafka_timeout_seconds=5,
        # What the chart's monitoring.release sets: kube-prometheus-stack selects by it.
        service_monitor_labels={"release": "kube-prometheus-stack"},
    )
    with operator_running(control_plane, config):
        yield


@pytest.fixture
def optional_crds(control_plane: ControlPlane) -> Iterator[None]:
    control_plane.apply([crd(*c) for c in OPTIONAL_CRDS])
    for group, plural, _, _ in OPTIONAL_CRDS:
        control_plane.kubectl("wait", "--for=condition=Established", f"crd/{plural}.{group}")
    yield
    # Other tests run without them.
    for group, plural, _, _ in OPTIONAL_CRDS:
        control_plane.kubectl("delete", "crd", f"{plural}.{group}", "--wait=false", check=False)


def autoscaled(name: str, bootstrap: str, topic: str) -> str:
    return yaml.safe_dump(
        consumer_pipeline(
            name,
            {
                "kafka": {"bootstrapServers": bootstrap},
                "source": {"topics": [topic]},  # the default groupId: <namespace>.<name>
                "sink": {"log": {}},
                "autoscaling": {
                    "enabled": True,
                    "minReplicas": 1,
                    "maxReplicas": 10,
                    "targetLagPerReplica": 50,
                },
            },
        )
    )


def test_hpa_on_the_scale_subresource_capped_at_the_partition_count(
    kubectl: Kubectl,
    kube_namespace: str,
    kafka_broker: Any,
    topic_factory: TopicFactory,
    operator: None,
) -> None:
    ns = kube_namespace
    topic = topic_factory(partitions=3)
    kubectl("apply", "-n", ns, "-f", "-", input=autoscaled("scaly", kafka_broker.bootstrap, topic))
    wait_for(
        lambda: (get(kubectl, "cpl", "scaly", "-n", ns).get("status") or {}).get("partitions") == 3,
        what="the partition count measured on the real broker",
    )
    hpa = wait_for(
        lambda: (h := get(kubectl, "hpa", "scaly", "-n", ns))["spec"]["maxReplicas"] == 3 and h,
        what="an HPA capped at 3",
    )
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "name": "scaly",
    }
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "offtake_consumer_lag_messages"
    assert hpa["metadata"]["ownerReferences"][0]["name"] == "scaly"
    patch(kubectl, ns, "cpl/scaly", {"spec": {"paused": True}})
    wait_for(lambda: not exists(kubectl, "hpa", "scaly", "-n", ns), what="no HPA while paused")


def test_lag_seconds_hpa_on_the_external_metric_accepted_by_the_api_server(
    kubectl: Kubectl,
    kube_namespace: str,
    kafka_broker: Any,
    topic_factory: TopicFactory,
    operator: None,
) -> None:
    ns = kube_namespace
    topic = topic_factory(partitions=4)
    body = yaml.safe_load(autoscaled("timely", kafka_broker.bootstrap, topic))
    auto = body["spec"]["autoscaling"]
    del auto["targetLagPerReplica"]
    auto.update(targetLagSeconds=30, scaleDownStabilizationSeconds=60)
    kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))
    # Read back from the real API server: autoscaling/v2 validated and stored the External
    # metric, its selector, the Value target and the behaviour, capped at 4 partitions.
    hpa = wait_for(
        lambda: (h := get(kubectl, "hpa", "timely", "-n", ns))["spec"]["maxReplicas"] == 4 and h,
        what="an HPA on lag seconds capped at 4",
    )
    (metric,) = hpa["spec"]["metrics"]
    assert metric == {
        "type": "External",
        "external": {
            "metric": {
                "name": "offtake_consumer_lag_seconds",
                "selector": {"matchLabels": {"pipeline": "timely"}},
            },
            "target": {"type": "Value", "value": "30"},
        },
    }
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 60
    # A scaling decision shows in kubectl describe as an Event with the autoscaler's context.
    kubectl("scale", "cpl/timely", "-n", ns, "--replicas=3")
    wait_for(
        lambda: (
            "workers: 1 -> 3 (autoscaler: HorizontalPodAutoscaler; lag"
            in kubectl("describe", "cpl", "timely", "-n", ns).stdout
        ),
        what="the Scaled event in kubectl describe",
    )
    # REASON and MESSAGE columns of kubectl get.
    table = kubectl("get", "cpl", "timely", "-n", ns).stdout.splitlines()
    assert table[0].split()[7:10] == ["REASON", "MESSAGE", "AGE"], table[0]
    assert table[1].split()[7] == "WorkersNotReady", table[1]  # no kubelet in this test
    # Both targets at once: the API server's CEL rule refuses it, naming the fields.
    both = patch(
        kubectl, ns, "cpl/timely", {"spec": {"autoscaling": {"targetLagPerReplica": 100}}},
        check=False,
    )  # fmt: skip
    assert both.returncode != 0
    assert "either targetLagSeconds or targetLagPerReplica" in both.stderr


def test_servicemonitor_and_keda_scaledobject_when_their_crds_exist(
    kubectl: Kubectl,
    kube_namespace: str,
    kafka_broker: Any,
    topic_factory: TopicFactory,
    optional_crds: None,
    operator: None,
) -> None:
    ns = kube_namespace
    topic = topic_factory(partitions=2)
    kubectl("apply", "-n", ns, "-f", "-", input=autoscaled("kedaed", kafka_broker.bootstrap, topic))
    sm = wait_for(
        lambda: get(kubectl, "servicemonitors.monitoring.coreos.com", "kedaed", "-n", ns),
        what="the ServiceMonitor",
    )
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # A pipeline adds its own labels; a later change reaches the ServiceMonitor.
    patch(kubectl, ns, "cpl/kedaed", {"spec": {"serviceMonitor": {"labels": {"team": "shop"}}}})
    wait_for(
        lambda: (
            get(kubectl, "servicemonitors.monitoring.coreos.com", "kedaed", "-n", ns)["metadata"][
                "labels"
            ].get("team")
            == "shop"
        ),
        what="the pipeline's ServiceMonitor label",
    )
    so = wait_for(
        lambda: (
            (s := get(kubectl, "scaledobjects.keda.sh", "kedaed", "-n", ns))["spec"][
                "maxReplicaCount"
            ]
            == 2
            and s
        ),
        what="a ScaledObject capped at 2 partitions",
    )
    trigger = so["spec"]["triggers"][0]
    assert trigger["type"] == "kafka"
    assert (
        trigger["metadata"]["consumerGroup"] == f"{ns}.kedaed"
        and trigger["metadata"]["topic"] == topic
    )
    assert not exists(kubectl, "hpa", "kedaed", "-n", ns), (
        "KEDA makes its own HPA; the operator makes none"
    )
    # Lag in seconds: KEDA's Prometheus scaler replaces the Kafka one, same object.
    patch(
        kubectl, ns, "cpl/kedaed", [
            {"op": "remove", "path": "/spec/autoscaling/targetLagPerReplica"},
            {"op": "add", "path": "/spec/autoscaling/targetLagSeconds", "value": 20},
            {"op": "add", "path": "/spec/autoscaling/prometheusAddress", "value": "http://prom:9090"},
        ], kind="json",
    )  # fmt: skip
    so = wait_for(
        lambda: (
            (s := get(kubectl, "scaledobjects.keda.sh", "kedaed", "-n", ns))["spec"]["triggers"][0][
                "type"
            ]
            == "prometheus"
            and s
        ),
        what="the ScaledObject on KEDA's Prometheus scaler",
    )
    (trigger,) = so["spec"]["triggers"]
    assert trigger["metricType"] == "Value"
    assert trigger["metadata"]["threshold"] == "20"
    assert trigger["metadata"]["query"] == (
        f'max(offtake_consumer_lag_seconds{{namespace="{ns}", pipeline="kedaed"}})'
    )
    patch(kubectl, ns, "cpl/kedaed", {"spec": {"autoscaling": {"enabled": False}}})
    wait_for(
        lambda: not exists(kubectl, "scaledobjects.keda.sh", "kedaed", "-n", ns),
        what="the ScaledObject removed",
    )


def test_slo_prometheusrule_owned_by_the_pipeline_and_removed_with_spec_slo_and_with_it(
    kubectl: Kubectl,
    kube_namespace: str,
    kafka_broker: Any,
    topic_factory: TopicFactory,
    optional_crds: None,
    operator: None,
) -> None:
    ns = kube_namespace
    topic = topic_factory(partitions=1)
    body = yaml.safe_load(autoscaled("sloed", kafka_broker.bootstrap, topic))
    body["spec"]["slo"] = {"maxLagSeconds": 30, "maxErrorRatio": 0.001}
    kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))
    rule = wait_for(
        lambda: get(kubectl, "prometheusrules.monitoring.coreos.com", "sloed-slo", "-n", ns),
        what="the pipeline's PrometheusRule",
    )
    assert rule["metadata"]["ownerReferences"][0]["name"] == "sloed"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    alerts = {r["alert"] for r in rule["spec"]["groups"][0]["rules"] if "alert" in r}
    assert alerts == {"OfftakeSLOLagSeconds", "OfftakeSLOErrorBudgetBurn"}
    # The API server applied the CRD's default for alertAfterSeconds (120 s).
    assert get(kubectl, "cpl", "sloed", "-n", ns)["spec"]["slo"]["alertAfterSeconds"] == 120
    wait_for(
        lambda: (
            (get(kubectl, "cpl", "sloed", "-n", ns).get("status") or {}).get("sloRule")
            == "sloed-slo"
        ),
        what="status.sloRule",
    )
    patch(kubectl, ns, "cpl/sloed", [{"op": "remove", "path": "/spec/slo"}], kind="json")
    wait_for(
        lambda: not exists(kubectl, "prometheusrules.monitoring.coreos.com", "sloed-slo", "-n", ns),
        what="the PrometheusRule removed with spec.slo",
    )
    # Set again, then the pipeline deleted: the real garbage collector follows the owner.
    kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))
    wait_for(
        lambda: exists(kubectl, "prometheusrules.monitoring.coreos.com", "sloed-slo", "-n", ns),
        what="the PrometheusRule back",
    )
    kubectl("delete", "cpl", "sloed", "-n", ns)
    wait_for(
        lambda: not exists(kubectl, "prometheusrules.monitoring.coreos.com", "sloed-slo", "-n", ns),
        what="the PrometheusRule garbage-collected with its pipeline",
    )


def test_keda_authenticates_with_the_pipelines_kafka_secret(
    kubectl: Kubectl, kube_namespace: str, optional_crds: None, operator: None
) -> None:
    ns = kube_namespace
    kubectl(
        "create", "secret", "generic", "kafka-user", "-n", ns,
        "--from-literal=sasl.username=orders", "--from-literal=sasl.password=keda-pw-1",
        "--from-literal=ca.crt=-----BEGIN CERTIFICATE-----",
    )  # fmt: skip
    body = yaml.safe_load(autoscaled("secured", "kafka:9093", "orders"))
    body["spec"]["kafka"].update(
        secretRef={"name": "kafka-user"},
        config={"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"},
    )
    kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))
    auth = wait_for(
        lambda: get(kubectl, "triggerauthentications.keda.sh", "secured", "-n", ns),
        what="the TriggerAuthentication",
    )
    assert sorted(auth["spec"]["secretTargetRef"], key=lambda r: r["parameter"]) == [
        {"parameter": "ca", "name": "kafka-user", "key": "ca.crt"},
        {"parameter": "password", "name": "kafka-user", "key": "sasl.password"},
        {"parameter": "username", "name": "kafka-user", "key": "sasl.username"},
    ]
    so = wait_for(
        lambda: get(kubectl, "scaledobjects.keda.sh", "secured", "-n", ns), what="ScaledObject"
    )
    (trigger,) = so["spec"]["triggers"]
    assert trigger["authenticationRef"] == {"name": "secured"}
    assert trigger["metadata"]["sasl"] == "scram_sha512" and trigger["metadata"]["tls"] == "enable"
    assert (
        "keda-pw-1"
        not in kubectl(
            "get", "scaledobjects.keda.sh,triggerauthentications.keda.sh", "-n", ns, "-o", "json"
        ).stdout
    )
