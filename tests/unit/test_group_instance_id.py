"""The worker's group.instance.id: one resolution of the pod's identity (flag, env, spec)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from offtake.cli import group_instance_id
from offtake.config import PipelineSpec, parse_pipeline


def spec(**kafka: Any) -> PipelineSpec:
    return parse_pipeline(
        {
            "apiVersion": "offtake.dev/v1alpha1",
            "kind": "ConsumerPipeline",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "kafka": {"bootstrapServers": "k:9092", **kafka},
                "source": {"topics": ["a"]},
                "sink": {"log": {}},
            },
        }
    )


@pytest.fixture(autouse=True)
def no_identity_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("POD_NAME", "OFFTAKE_GROUP_INSTANCE_ID", "OFFTAKE_STATIC_MEMBERSHIP"):
        monkeypatch.delenv(name, raising=False)


def test_dynamic_membership_by_default_even_in_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "orders-7f9c-0")
    assert group_instance_id(spec(), None) is None


def test_static_membership_uses_the_pod_name_else_the_host_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert group_instance_id(spec(staticMembership=True), None) == socket.gethostname()
    monkeypatch.setenv("POD_NAME", "orders-7f9c-0")
    assert group_instance_id(spec(staticMembership=True), None) == "orders-7f9c-0"
    monkeypatch.setenv("OFFTAKE_STATIC_MEMBERSHIP", "true")  # the same from the environment
    assert group_instance_id(spec(), None) == "orders-7f9c-0"


def test_an_explicit_id_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "orders-7f9c-0")
    monkeypatch.setenv("OFFTAKE_GROUP_INSTANCE_ID", "from-env")
    assert group_instance_id(spec(staticMembership=True), None) == "from-env"
    assert group_instance_id(spec(), "from-flag") == "from-flag"


def test_the_transactional_instance_takes_the_pod_name_from_the_cli(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """assembly.instance names the worker in its transactional.id: the static id, else the pod's
    name the CLI read from $POD_NAME (the edge), else host and process; it reads no environment."""
    from offtake.engine.assembly import instance

    monkeypatch.setenv("POD_NAME", "from-env")
    assert instance("static-0", "orders-7f9c-0") == "static-0"
    assert instance(None, "orders-7f9c-0") == "orders-7f9c-0"
    assert instance(None) != "from-env"  # the engine takes the value, never the variable
