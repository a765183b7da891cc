"""The webhook's guard in front of kopf, with kopf's own admission engine and memory store.

kopf keeps a memo per object uid for every admission review but a CREATE, and nothing forgets
the memo of an object that never comes to exist: a caller sending reviews with fresh uids grows
the operator's memory without bound. The guard lets only Pod CREATE reviews through; here
hundreds of reviews of every other operation are refused by it, and hundreds of CREATE reviews
that pass go through kopf's real ``serve_admission_request`` with our handlers and leave its
memory store empty. (tests/e2e/test_webhook_guard.py attacks the guard over TLS.)
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, cast

import kopf
import pytest
from kopf._cogs.structs import ephemera, references
from kopf._core.engines.admission import serve_admission_request
from kopf._core.reactor.inventory import ResourceMemories

from offtake_operator.webhook import REGISTRY
from offtake_operator.webhook_guard import review_problem

N = 300


def review(operation: str, *, kind: str = "Pod", sub: str = "") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": sub,
            "operation": operation,
            "userInfo": {"username": "someone"},
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p", "namespace": "ns", "uid": str(uuid.uuid4())},
                "spec": {"containers": [{"name": "app", "image": "x"}]},
            },
        },
    }


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (review("UPDATE"), "request.operation"),
        (review("DELETE"), "request.operation"),
        (review("CONNECT"), "request.operation"),
        (review("CREATE", kind="Secret"), "request.kind"),
        (review("CREATE", sub="ephemeralcontainers"), "request.subResource"),
        ({**review("CREATE"), "apiVersion": "admission.k8s.io/v1beta1"}, "apiVersion"),
        ({"kind": "AdmissionReview"}, "apiVersion"),
        ([1, 2], "not a JSON object"),
        ({**review("CREATE"), "request": {**review("CREATE")["request"], "uid": ""}}, "uid"),
    ],
)
def test_what_the_webhook_does_not_handle_is_named(data: Any, field: str) -> None:
    problem = review_problem(data)
    assert problem is not None and field in problem
    assert review_problem(review("CREATE")) is None


def test_kopfs_memory_stays_empty_after_hundreds_of_reviews() -> None:
    for operation in ("UPDATE", "DELETE", "CONNECT"):
        assert all(review_problem(review(operation)) for _ in range(N))

    async def serve(operation: str, count: int) -> ResourceMemories:
        memories = ResourceMemories()
        pods = references.Resource("", "v1", "pods", kind="Pod", namespaced=True)
        insights = references.Insights()
        insights.webhook_resources.add(pods)
        for _ in range(count):
            answer = await serve_admission_request(
                cast(Any, review(operation)),
                webhook=cast(Any, "inject-worker"),
                settings=kopf.OperatorSettings(),
                memories=memories,
                memobase=cast(Any, ephemera.Memo()),
                registry=REGISTRY,
                insights=insights,
                indices={},
            )
            assert answer["response"]["allowed"] is True  # no annotation: admitted unchanged
        return memories

    assert review_problem(review("CREATE")) is None  # what the guard lets through
    assert len(asyncio.run(serve("CREATE", N))._items) == 0
    # The control: what the guard stops would have stayed in kopf's memory, one per uid.
    assert len(asyncio.run(serve("UPDATE", 5))._items) == 5
