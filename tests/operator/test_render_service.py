"""The metrics Service and the PodDisruptionBudget (render.service, render.pdb)."""

from __future__ import annotations

from operator_testkit import pipeline_body
from render_testkit import parsed

from offtake_operator import render


def test_service_and_pdb() -> None:
    body = pipeline_body(metrics={"port": 9300})
    svc = render.render_service(body, parsed(body))
    assert svc["metadata"]["name"] == "orders-metrics"
    assert svc["spec"]["selector"] == {"offtake.dev/pipeline": "orders"}
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": 9300, "targetPort": "metrics", "protocol": "TCP"}
    ]
    pdb = render.render_pdb(body)
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": {"offtake.dev/pipeline": "orders"}},
    }
