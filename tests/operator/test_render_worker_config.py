"""The worker's configuration document and its ConfigMap (render.worker_config)."""

from __future__ import annotations

from typing import Any

import yaml
from operator_testkit import example, pipeline_body
from render_testkit import deployment

from offtake.config import load_pipeline
from offtake_operator import names, render


def test_configmap_holds_a_manifest_the_worker_loads(tmp_path: Any) -> None:
    body = example("kafka-to-kafka.yaml")
    cm = render.render_configmap(body)
    assert cm["metadata"]["name"] == "orders-enrich-pipeline"
    text = cm["data"]["pipeline.yaml"]
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    loaded = load_pipeline(path)
    assert loaded.name == "orders-enrich" and loaded.namespace == "shop"
    assert loaded.processor.function == "offtake_examples.enrich:handle"
    assert loaded.sink.kafka is not None and loaded.sink.kafka.topic == "orders-enriched"
    doc = yaml.safe_load(text)
    assert doc["apiVersion"] == "offtake.dev/v1alpha1" and doc["kind"] == "ConsumerPipeline"
    # Deployment-level fields stay out, so scaling does not roll the pods.
    assert "replicas" not in doc["spec"] and "paused" not in doc["spec"]


def test_config_changes_change_the_checksum_but_scaling_does_not() -> None:
    def checksum(body: dict[str, Any]) -> str:
        value: str = deployment(body)["spec"]["template"]["metadata"]["annotations"][
            names.CHECKSUM_ANNOTATION
        ]
        return value

    base = pipeline_body()
    assert checksum(base) == checksum(pipeline_body())
    assert checksum(pipeline_body(replicas=5)) == checksum(base)
    assert checksum(pipeline_body(paused=True)) == checksum(base)
    assert checksum(pipeline_body(commit={"intervalSeconds": 5})) != checksum(base)
    assert checksum(pipeline_body(source={"topics": ["other"]})) != checksum(base)
