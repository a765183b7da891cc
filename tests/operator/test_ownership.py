"""Which existing objects a pipeline may change (offtake_operator.apply's adoption rule).

The rule in short: an object holding a child's name is this pipeline's when it carries the
pipeline's uid in an ownerReference, or Offtake's labels for it; never when another controller
owns it, nor when it is merely unlabelled (Helm's, kubectl's). The same objects on the real
API server, with its garbage collector: tests/e2e/test_operator_ownership.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from operator_testkit import pipeline_body

from offtake_operator import render
from offtake_operator.apply import NotOursError, Taken, carries_uid, refusal
from offtake_operator.status import NAME_TAKEN, Observed, compute_status

BODY = pipeline_body("orders", namespace="shop", uid="uid-1")
DESIRED = render.render_configmap(BODY)


def existing(
    *,
    labels: dict[str, str] | None = None,
    refs: list[dict[str, Any]] | None = None,
    namespace: str = "shop",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "orders-pipeline", "namespace": namespace, "uid": "cm-9"}
    if labels is not None:
        meta["labels"] = labels
    if refs is not None:
        meta["ownerReferences"] = refs
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"x": "1"}}


def ref(uid: str, *, controller: bool) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Thing", "name": "t", "uid": uid, "controller": controller}


OFFTAKE_LABELS = {
    "app.kubernetes.io/managed-by": "offtake-operator",
    "offtake.dev/pipeline": "orders",
}


def test_an_object_carrying_this_pipelines_uid_is_adopted_whether_controller_or_not() -> None:
    assert refusal(existing(refs=[ref("uid-1", controller=True)]), DESIRED) is None
    # A non-controller reference to this pipeline is as good (someone handed it over).
    assert refusal(existing(refs=[ref("uid-1", controller=False)]), DESIRED) is None
    assert carries_uid(
        existing(refs=[ref("x", controller=False), ref("uid-1", controller=False)]), "uid-1"
    )


def test_an_object_with_offtake_labels_for_this_pipeline_is_adopted() -> None:
    # Left by an earlier pipeline of this name (e.g. deleted with --cascade=orphan).
    assert refusal(existing(labels=OFFTAKE_LABELS), DESIRED) is None


@pytest.mark.parametrize(
    ("labels", "what"),
    [
        (None, "kubectl's: no labels"),
        ({"app.kubernetes.io/managed-by": "Helm", "offtake.dev/pipeline": "orders"}, "Helm's"),
        ({"app.kubernetes.io/managed-by": "offtake-operator"}, "no pipeline label"),
        ({**OFFTAKE_LABELS, "offtake.dev/pipeline": "payments"}, "another pipeline's"),
        ({"offtake.dev/pipeline": "orders"}, "pipeline label alone"),
    ],
)
def test_an_object_without_this_pipelines_uid_or_labels_is_refused(
    labels: dict[str, str] | None, what: str
) -> None:
    why = refusal(existing(labels=labels), DESIRED)
    assert why is not None, what
    assert "uid-1" in why and "ConsumerPipeline orders" in why


def test_labels_never_take_an_object_from_another_controller_nor_another_namespace() -> None:
    other = existing(labels=OFFTAKE_LABELS, refs=[ref("uid-2", controller=True)])
    assert "controlled by another owner (uid uid-2)" in str(refusal(other, DESIRED))
    # A non-controller reference to someone else does not block adoption by labels.
    shared = existing(labels=OFFTAKE_LABELS, refs=[ref("uid-2", controller=False)])
    assert refusal(shared, DESIRED) is None
    assert refusal(existing(labels=OFFTAKE_LABELS, namespace="billing"), DESIRED) is not None


def test_the_refusal_names_every_object_and_what_to_do() -> None:
    exc = NotOursError(
        [
            Taken("Deployment", "shop/orders", "was not made by ConsumerPipeline orders"),
            Taken("ConfigMap", "shop/orders-pipeline", "was not made by ConsumerPipeline orders"),
        ]
    )
    text = str(exc)
    assert "Deployment shop/orders already exists" in text
    assert "ConfigMap shop/orders-pipeline already exists" in text
    assert "changes nothing" in text and "rename the pipeline" in text
    assert "app.kubernetes.io/managed-by=offtake-operator" in text


def test_a_taken_name_is_ready_false_and_degraded_with_reason_name_taken_and_a_warning() -> None:
    message = str(NotOursError([Taken("Service", "shop/orders-metrics", "was not made by X")]))
    status, events = compute_status(
        {}, Observed("orders", 1, 2, failed=message, failed_reason=NAME_TAKEN), now="T"
    )
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Ready"]["reason"] == NAME_TAKEN
    assert conditions["Degraded"]["status"] == "True"
    assert conditions["Degraded"]["reason"] == NAME_TAKEN
    assert "Service shop/orders-metrics" in conditions["Degraded"]["message"]
    assert status["phase"] == "Failed" and status["reason"] == NAME_TAKEN
    assert [(e.type, e.reason) for e in events] == [("Warning", NAME_TAKEN)]
    assert "Service shop/orders-metrics" in events[0].message
    # The next pass, the same refusal: no second Event.
    _, again = compute_status(
        status, Observed("orders", 1, 2, failed=message, failed_reason=NAME_TAKEN), now="T2"
    )
    assert again == []
