"""Defaults a shared cluster expects on every worker container the operator makes: requests
and a memory limit (the chart's worker.resources / worker.sparkResources, passed to the
operator as OFFTAKE_WORKER_RESOURCES / OFFTAKE_WORKER_SPARK_RESOURCES), replaced whole by a
pipeline's spec.resources; and no service account token in pods that never call the API."""

from __future__ import annotations

import json
from typing import Any

import pytest
from operator_testkit import example, pipeline_body

from offtake.config import parse_pipeline
from offtake.config.redrive import parse_redrive
from offtake_operator import inject, render
from offtake_operator.reconcile import worker_manifest
from offtake_operator.settings import (
    DEFAULT_WORKER_RESOURCES,
    DEFAULT_WORKER_SPARK_RESOURCES,
    OperatorConfig,
    SettingsError,
)

CHART_LIKE = {"requests": {"cpu": "200m", "memory": "300Mi"}, "limits": {"memory": "600Mi"}}
CONFIG = OperatorConfig.from_env({"OFFTAKE_WORKER_RESOURCES": json.dumps(CHART_LIKE)})
POD = {
    "metadata": {"annotations": {"offtake.dev/pipeline": "orders"}},
    "spec": {"containers": [{"name": "app", "image": "app:1"}]},
}


def _containers(body: dict[str, Any], config: OperatorConfig = CONFIG) -> dict[str, Any]:
    """The worker container of each place it runs: the Deployment, injected, the redrive Job."""
    pipeline = parse_pipeline(worker_manifest(body))
    deployment = render.render_deployment(body, pipeline, config, replicas=1)
    injected, _ = inject.injected_pod(POD, body, pipeline, config)
    request = parse_redrive({"id": "r1", "from": "dlq", "until": "2026-05-01T12:00:00Z"}, None)
    assert request is not None
    job = render.render_redrive_job(body, pipeline, config, request, "g.redrive")
    return {
        "deployment": deployment["spec"]["template"]["spec"]["containers"][0],
        "injected": injected["spec"]["initContainers"][-1],
        "redrive": job["spec"]["template"]["spec"]["containers"][0],
    }


def test_every_worker_container_gets_the_operators_default_resources() -> None:
    for where, container in _containers(pipeline_body()).items():
        assert container["resources"] == CHART_LIKE, where


def test_the_built_in_default_has_requests_and_a_memory_limit_but_no_cpu_limit() -> None:
    defaults = OperatorConfig()
    assert defaults.worker_resources == DEFAULT_WORKER_RESOURCES
    for resources in (DEFAULT_WORKER_RESOURCES, DEFAULT_WORKER_SPARK_RESOURCES):
        assert set(resources["requests"]) == {"cpu", "memory"}
        assert set(resources["limits"]) == {"memory"}
    for container in _containers(pipeline_body(), defaults).values():
        assert container["resources"] == DEFAULT_WORKER_RESOURCES


def test_a_spark_sink_gets_the_spark_default() -> None:
    body = example("spark-parquet.yaml")
    spark = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
    config = OperatorConfig.from_env({"OFFTAKE_WORKER_SPARK_RESOURCES": json.dumps(spark)})
    pipeline = parse_pipeline(worker_manifest(body))
    deployment = render.render_deployment(body, pipeline, config, replicas=1)
    assert deployment["spec"]["template"]["spec"]["containers"][0]["resources"] == spark


def test_spec_resources_replace_the_default_whole_everywhere() -> None:
    # Whole, not merged: a request of the pipeline's own above the default memory limit
    # (1Gi here against 600Mi) must not end in a pod the API server refuses.
    own = {"requests": {"memory": "1Gi"}}
    for where, container in _containers(pipeline_body(resources=own)).items():
        assert container["resources"] == own, where


def test_an_empty_default_renders_no_resources() -> None:
    config = OperatorConfig.from_env({"OFFTAKE_WORKER_RESOURCES": "{}"})
    for where, container in _containers(pipeline_body(), config).items():
        assert "resources" not in container, where


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ("not json", "expected a JSON object"),
        ("[1]", "expected a JSON object of requests and limits"),
        ('{"request": {"cpu": "1"}}', "unknown key 'request'"),
        ('{"limits": {"memory": true}}', "limits must map resource names to quantities"),
        ('{"limits": "1Gi"}', "limits must map resource names to quantities"),
    ],
)
def test_a_bad_default_is_refused_naming_the_variable(raw: str, named: str) -> None:
    with pytest.raises(SettingsError) as err:
        OperatorConfig.from_env({"OFFTAKE_WORKER_RESOURCES": raw})
    assert str(err.value).startswith("OFFTAKE_WORKER_RESOURCES: ")
    assert named in str(err.value)


def test_worker_and_redrive_pods_mount_no_service_account_token() -> None:
    body = pipeline_body(template={"spec": {"serviceAccountName": "orders"}})
    pipeline = parse_pipeline(worker_manifest(body))
    deployment = render.render_deployment(body, pipeline, CONFIG, replicas=1)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == "orders"
    request = parse_redrive({"id": "r1", "from": "dlq", "until": "2026-05-01T12:00:00Z"}, None)
    assert request is not None
    job = render.render_redrive_job(body, pipeline, CONFIG, request, "g.redrive")
    assert job["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
