"""The watched children as the operator last saw them (OperatorContext.children): what makes a
watch event news, and when a pass takes a child from there instead of reading it."""

from __future__ import annotations

import asyncio
from typing import Any

from offtake_operator.context import CHILDREN_REREAD_SECONDS, OperatorContext, PipelineState
from offtake_operator.ensure import claim_child
from offtake_operator.kubeapi import DEPLOYMENTS, HPAS, PDBS, Resource
from offtake_operator.settings import OperatorConfig


def child(name: str, version: str, *, status: Any = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "shop",
            "resourceVersion": version,
            "labels": {"offtake.dev/pipeline": "orders"},
            "ownerReferences": [{"kind": "ConsumerPipeline", "uid": "uid-1", "controller": True}],
            "managedFields": [{"manager": "offtake"}],
        },
        "spec": spec,
        "status": status or {},
    }


def test_a_version_seen_is_no_news_and_a_change_is() -> None:
    ctx = OperatorContext(OperatorConfig())
    ctx.note_child(DEPLOYMENTS, child("orders", "5", replicas=2))
    assert ctx.knows(DEPLOYMENTS, child("orders", "5", replicas=2))  # the echo of our write
    assert not ctx.knows(DEPLOYMENTS, child("orders", "6", replicas=9))  # drift
    # A Deployment's status makes the pipeline's: its every change is news.
    assert not ctx.knows(DEPLOYMENTS, child("orders", "7", replicas=2, status={"ready": 1}))
    # A PDB's status (the disruption controller's) is read by nothing: no news, until its
    # content changes.
    ctx.note_child(PDBS, child("orders", "3", minAvailable=1))
    assert ctx.knows(PDBS, child("orders", "4", minAvailable=1, status={"expectedPods": 2}))
    assert not ctx.knows(PDBS, child("orders", "5", minAvailable=0))
    assert not ctx.knows(PDBS, child("other", "5", minAvailable=1))  # never seen


def test_only_watched_children_are_kept_and_without_their_managed_fields() -> None:
    ctx = OperatorContext(OperatorConfig())
    ctx.note_child(HPAS, child("orders", "5"))  # no watch would tell its changes
    assert ctx.child(HPAS, "shop", "orders") is None
    ctx.note_child(DEPLOYMENTS, child("orders", "5", replicas=2))
    kept = ctx.child(DEPLOYMENTS, "shop", "orders")
    assert kept is not None and "managedFields" not in kept["metadata"]
    assert kept["spec"] == {"replicas": 2}
    ctx.forget("shop", "orders")
    assert ctx.child(DEPLOYMENTS, "shop", "orders") is None


def test_the_children_are_read_again_every_reread_interval() -> None:
    state = PipelineState()
    assert not state.children_trusted(1000.0)  # the first pass reads them
    assert state.children_trusted(1000.0 + CHILDREN_REREAD_SECONDS - 1)
    assert not state.children_trusted(1000.0 + CHILDREN_REREAD_SECONDS)
    assert state.children_trusted(1000.0 + CHILDREN_REREAD_SECONDS + 1)


class CountingApi:
    def __init__(self, found: dict[str, Any] | None) -> None:
        self.found = found
        self.gets = 0

    async def get(self, res: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets += 1
        return self.found


def test_a_trusted_pass_takes_a_known_child_and_reads_an_unknown_one() -> None:
    ctx = OperatorContext(OperatorConfig())
    api = CountingApi(child("orders", "8", replicas=2))
    ctx.api = api  # type: ignore[assignment]
    desired = child("orders", "", replicas=2)
    desired["metadata"]["ownerReferences"][0]["name"] = "orders"
    del desired["metadata"]["resourceVersion"]
    # Unknown: read, and kept for the next pass.
    found = asyncio.run(claim_child(ctx, DEPLOYMENTS, desired, True))
    assert api.gets == 1 and found is not None and found["metadata"]["resourceVersion"] == "8"
    # Known: no read while trusted.
    asyncio.run(claim_child(ctx, DEPLOYMENTS, desired, True))
    assert api.gets == 1
    # Not trusted (every CHILDREN_REREAD_SECONDS): read, and a child gone is forgotten.
    api.found = None
    assert asyncio.run(claim_child(ctx, DEPLOYMENTS, desired, False)) is None
    assert api.gets == 2 and ctx.child(DEPLOYMENTS, "shop", "orders") is None
