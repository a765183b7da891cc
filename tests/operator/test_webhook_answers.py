"""What the injection webhook's handler answers, and what each review costs, when the review
is a forgery: a pod in which no app of the caller runs, naming a pipeline of another namespace.

The handler is kopf's (called here as kopf calls it) with the operator's own context; the API
is a stand-in that counts reads by kind, since the cost asked about is the API reads. A review
refused for any reason that depends on the pipeline (none there, another mode, an invalid spec,
a group id of another namespace, a missing Secret) gets one and the same answer, naming only
what the review itself carries, and costs one read (the pipeline), no Secret's (but for an
injectable pipeline, whose Secret has to be read to inject it).
(tests/e2e/test_webhook_guard.py: a caller without the API server's client certificate is
refused at TLS.)
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import kopf
import pytest
from operator_testkit import pipeline_body

from offtake_operator import names
from offtake_operator.context import MEMO_KEY, OperatorContext
from offtake_operator.kubeapi import PIPELINES, SECRETS, Resource
from offtake_operator.settings import OperatorConfig
from offtake_operator.webhook import inject_worker

CONFIG = OperatorConfig(worker_image="registry.test/offtake:1.2.3", lag_source="off")


class CountingApi:
    """Objects by (kind, namespace, name); every get recorded."""

    def __init__(self, objects: dict[tuple[str, str, str], dict[str, Any]]) -> None:
        self.objects = objects
        self.reads: list[tuple[str, str, str]] = []

    async def get(self, res: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads.append((res.kind, namespace, name))
        return self.objects.get((res.kind, namespace, name))


def secret(namespace: str) -> dict[str, Any]:
    data = {"sasl.username": "u", "sasl.password": "hunter2"}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "kafka", "namespace": namespace},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def inject_pipeline(namespace: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "mode": "inject",
        "processor": {"container": {"port": 8080}},
        "kafka": {"bootstrapServers": "kafka:9092", "secretRef": {"name": "kafka"}},
    }
    base.update(spec)
    return pipeline_body("orders", namespace=namespace, **base)


def forged_pod(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "probe",
            "namespace": namespace,
            "labels": {names.PIPELINE_LABEL: "orders"},
            "annotations": {names.INJECT_ANNOTATION: "orders"},
        },
        "spec": {"containers": [{"name": "app", "image": "x"}]},
    }


def answer(api: CountingApi, namespace: str) -> tuple[str | None, dict[str, Any]]:
    """(the refusal's message or None, the patch) of a review of ``forged_pod(namespace)``."""
    ctx = OperatorContext(CONFIG)
    ctx.api = api  # type: ignore[assignment]
    patch: dict[str, Any] = {}

    async def call() -> None:
        handler: Any = inject_worker  # called as kopf calls it, with plain dicts
        await handler(
            body=forged_pod(namespace), patch=patch, warnings=[], memo={MEMO_KEY: ctx}, dryrun=True
        )

    try:
        asyncio.run(call())
    except kopf.AdmissionError as exc:
        return str(exc), patch
    return None, patch


CASES = {
    "no pipeline": {},
    "deployment mode": {
        ("ConsumerPipeline", "victim", "orders"): inject_pipeline(
            "victim",
            mode="deployment",
            processor={"container": {"image": "registry.victim/secret-app:7"}},
        ),
        ("Secret", "victim", "kafka"): secret("victim"),
    },
    "invalid spec": {
        ("ConsumerPipeline", "victim", "orders"): inject_pipeline(
            "victim", limits={"maxInFlightMesages": 5}
        ),
        ("Secret", "victim", "kafka"): secret("victim"),
    },
    "another namespace's group": {
        ("ConsumerPipeline", "victim", "orders"): inject_pipeline(
            "victim", source={"topics": ["orders"], "groupId": "payments.ledger"}
        ),
        ("Secret", "victim", "kafka"): secret("victim"),
    },
    # The one refusal that needs the Secret read: an injectable pipeline whose Secret is gone.
    "its Secret missing": {
        ("ConsumerPipeline", "victim", "orders"): inject_pipeline("victim"),
    },
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_refused_review_says_the_same_whatever_the_namespace_holds(case: str) -> None:
    baseline, _ = answer(CountingApi({}), "victim")
    api = CountingApi(CASES[case])
    refused, patch = answer(api, "victim")
    assert refused is not None and patch == {}
    assert refused == baseline  # nothing in it depends on what namespace victim holds
    for leak in ("secret-app", "registry.victim", "deployment", "maxInFlight", "payments"):
        assert leak not in refused
    assert "no ConsumerPipeline 'orders' with spec.mode: inject" in refused
    # Its cost: the pipeline read, and no Secret read, before refusing (but where only the
    # Secret can tell).
    wanted = [PIPELINES.kind] + ([SECRETS.kind] if case == "its Secret missing" else [])
    assert [kind for kind, _, _ in api.reads] == wanted, api.reads


def test_an_injectable_pipeline_is_injected_with_one_secret_read() -> None:
    api = CountingApi(
        {
            ("ConsumerPipeline", "victim", "orders"): inject_pipeline("victim"),
            ("Secret", "victim", "kafka"): secret("victim"),
        }
    )
    refused, patch = answer(api, "victim")
    assert refused is None
    assert [c["name"] for c in patch["spec"]["initContainers"]] == [names.INJECTED_CONTAINER]
    assert [kind for kind, _, _ in api.reads] == [PIPELINES.kind, SECRETS.kind]
