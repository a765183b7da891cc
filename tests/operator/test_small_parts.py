"""Settings, operator-only spec fields, drift comparison, lag arithmetic, the CLI."""

from __future__ import annotations

import datetime

import pytest

from offtake.config import ConfigError
from offtake_operator.apply import covers
from offtake_operator.kubeapi import DEPLOYMENTS, PIPELINES, SERVICES
from offtake_operator.lag import compute_lag, lag_seconds
from offtake_operator.main import parse_args
from offtake_operator.operator_spec import Autoscaling, parse_operator_spec
from offtake_operator.rewind import pending
from offtake_operator.settings import (
    DEFAULT_WORKER_IMAGE,
    DEFAULT_WORKER_SPARK_IMAGE,
    OperatorConfig,
    SettingsError,
)


def test_settings_from_env() -> None:
    config = OperatorConfig.from_env(
        {
            "OFFTAKE_WORKER_IMAGE": "img:1",
            "OFFTAKE_RESYNC_SECONDS": "12",
            "OFFTAKE_NAMESPACES": "a, b,",
            "OFFTAKE_PEERING": "offtake",
            "OFFTAKE_LAG_SOURCE": "off",
        }
    )
    assert config.worker_image == "img:1" and config.resync_seconds == 12.0
    assert (
        config.namespaces == ("a", "b")
        and config.peering == "offtake"
        and config.lag_source == "off"
    )
    assert OperatorConfig.from_env({}).worker_image == DEFAULT_WORKER_IMAGE


def test_the_spark_worker_image_defaults_to_the_worker_spark_target() -> None:
    defaults = OperatorConfig.from_env({})
    assert defaults.worker_spark_image == DEFAULT_WORKER_SPARK_IMAGE
    # One image of the user's own (OFFTAKE_WORKER_IMAGE only) serves every pipeline.
    assert OperatorConfig.from_env({"OFFTAKE_WORKER_IMAGE": "mine:1"}).worker_spark_image == (
        "mine:1"
    )
    both = OperatorConfig.from_env(
        {"OFFTAKE_WORKER_IMAGE": "w:1", "OFFTAKE_WORKER_SPARK_IMAGE": "ws:1"}
    )
    assert (both.worker_image, both.worker_spark_image) == ("w:1", "ws:1")


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"OFFTAKE_RESYNC_SECONDS": "soon"}, "OFFTAKE_RESYNC_SECONDS"),
        ({"OFFTAKE_LAG_INTERVAL_SECONDS": "-1"}, "OFFTAKE_LAG_INTERVAL_SECONDS"),
        ({"OFFTAKE_LAG_SOURCE": "prometheus"}, "OFFTAKE_LAG_SOURCE"),
        ({"OFFTAKE_WORKER_IMAGE_PULL_POLICY": "Sometimes"}, "OFFTAKE_WORKER_IMAGE_PULL_POLICY"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], field: str) -> None:
    with pytest.raises(SettingsError, match=field):
        OperatorConfig.from_env(env)


def test_operator_spec() -> None:
    spec = parse_operator_spec(
        {
            "rewind": {"to": "timestamp", "timestamp": "2024-05-01T12:00:00Z", "id": "r7"},
            "autoscaling": {"enabled": True, "maxReplicas": 4},
        }
    )
    assert spec.rewind is not None and spec.rewind.id == "r7"
    assert spec.rewind.timestamp == datetime.datetime(2024, 5, 1, 12, tzinfo=datetime.UTC)
    assert spec.rewind.timestamp_ms == 1714564800000
    assert spec.autoscaling == Autoscaling(
        enabled=True,
        min_replicas=1,
        max_replicas=4,
        target_lag_per_replica=1000,
        scale_down_stabilization_seconds=300,
    )
    assert parse_operator_spec({}).rewind is None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"rewind": {"to": "earliest"}}, "spec.rewind.id"),
        ({"rewind": {"to": "yesterday", "id": "x"}}, "spec.rewind.to"),
        ({"rewind": {"to": "timestamp", "id": "x"}}, "spec.rewind.timestamp"),
        (
            {"rewind": {"to": "timestamp", "id": "x", "timestamp": "2024-05-01T12:00:00"}},
            "spec.rewind.timestamp",
        ),
        ({"autoscaling": {"minReplicas": -1}}, "spec.autoscaling.minReplicas"),
        ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}, "spec.autoscaling.minReplicas"),
        ({"autoscaling": "yes"}, "spec.autoscaling"),
        ({"autoscaling": {"targetLagSeconds": 0}}, "spec.autoscaling.targetLagSeconds"),
        (
            {"autoscaling": {"targetLagSeconds": 30, "targetLagPerReplica": 10}},
            "spec.autoscaling.targetLagSeconds",
        ),
        (
            {"autoscaling": {"scaleDownStabilizationSeconds": -5}},
            "spec.autoscaling.scaleDownStabilizationSeconds",
        ),
        ({"autoscaling": {"prometheusAddress": "prom:9090"}}, "spec.autoscaling.prometheusAddress"),
        ({"slo": {}}, "spec.slo"),
        ({"slo": "tight"}, "spec.slo"),
        ({"slo": {"maxLagSeconds": 0}}, "spec.slo.maxLagSeconds"),
        ({"slo": {"maxErrorRatio": 1}}, "spec.slo.maxErrorRatio"),
        ({"slo": {"maxErrorRatio": "1%"}}, "spec.slo.maxErrorRatio"),
        (
            {"slo": {"maxTimeSinceLastCommitSeconds": 1.5}},
            "spec.slo.maxTimeSinceLastCommitSeconds",
        ),
        ({"slo": {"maxLagSeconds": 5, "alertAfterSeconds": -1}}, "spec.slo.alertAfterSeconds"),
    ],
)
def test_operator_spec_errors_name_the_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_operator_spec(spec)
    assert err.value.path == field


def test_rewind_runs_once_per_id() -> None:
    spec = parse_operator_spec({"rewind": {"to": "latest", "id": "r1"}})
    assert pending(spec.rewind, {})
    assert pending(spec.rewind, {"rewind": {"lastId": "r0"}})
    assert not pending(spec.rewind, {"rewind": {"lastId": "r1"}})
    assert not pending(None, {})


def test_covers_ignores_server_defaults_but_not_drift() -> None:
    desired = {
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "w", "image": "a"}]}}}
    }
    actual = {
        "spec": {
            "replicas": 2,
            "progressDeadlineSeconds": 600,
            "template": {
                "spec": {
                    "containers": [{"name": "w", "image": "a", "terminationMessagePath": "/x"}]
                }
            },
        }
    }
    assert covers(actual, desired)
    actual["spec"]["replicas"] = 3
    assert not covers(actual, desired)
    assert not covers({"a": [1, 2]}, {"a": [1]})  # a list is owned whole
    assert not covers({"a": 1}, {"a": True})
    assert covers({"a": 1.0}, {"a": 1})


def test_lag_arithmetic() -> None:
    end = {("t", 0): 100, ("t", 1): 50, ("t", 2): 10}
    committed = {("t", 0): 90}
    start = {("t", 0): 0, ("t", 1): 20, ("t", 2): 0}
    assert compute_lag(end, committed, start, "earliest") == {
        ("t", 0): 10,
        ("t", 1): 30,
        ("t", 2): 10,
    }
    assert compute_lag(end, committed, start, "latest") == {("t", 0): 10, ("t", 1): 0, ("t", 2): 0}
    assert lag_seconds({("t", 0): 1_000, ("t", 1): 5_000}, now_ms=11_000) == 10.0
    assert lag_seconds({}, now_ms=11_000) == 0.0


def test_resource_paths() -> None:
    assert (
        PIPELINES.path("ns", "p", "status")
        == "/apis/offtake.dev/v1alpha1/namespaces/ns/consumerpipelines/p/status"
    )
    assert DEPLOYMENTS.path("ns") == "/apis/apps/v1/namespaces/ns/deployments"
    assert SERVICES.path("ns", "s") == "/api/v1/namespaces/ns/services/s"


def test_cli_arguments() -> None:
    args = parse_args(["-n", "a", "-n", "b", "--peering", "offtake", "--priority", "7"])
    assert args.namespace == ["a", "b"] and args.peering == "offtake" and args.priority == 7
