"""What every child carries: owner reference and labels (render.metadata)."""

from __future__ import annotations

from operator_testkit import example
from render_testkit import CONFIG, parsed

from offtake_operator import names, render
from offtake_operator.operator_spec import parse_operator_spec


def test_every_child_is_owned_and_labelled() -> None:
    body = example("sidecar.yaml")
    p = parsed(body)
    scaling = parse_operator_spec({"autoscaling": {"enabled": True}}).autoscaling
    children = [
        render.render_configmap(body),
        render.render_deployment(body, p, CONFIG, replicas=3),
        render.render_service(body, p),
        render.render_pdb(body),
        render.render_service_monitor(body),
        render.render_hpa(body, scaling, None),
        render.render_scaled_object(body, p, scaling, None),
    ]
    for child in children:
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref == {
            "apiVersion": "offtake.dev/v1alpha1",
            "kind": "ConsumerPipeline",
            "name": "orders-score",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert child["metadata"]["namespace"] == "shop"
        assert child["metadata"]["labels"][names.PIPELINE_LABEL] == "orders-score"
