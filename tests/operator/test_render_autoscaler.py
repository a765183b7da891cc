"""The choice of autoscaler (render.autoscaler): none, the HPA, or KEDA's ScaledObject with a
TriggerAuthentication from the pipeline's Kafka Secret."""

from __future__ import annotations

from typing import Any

from operator_testkit import pipeline_body
from render_testkit import parsed

from offtake_operator import render
from offtake_operator.operator_spec import Autoscaling, parse_operator_spec

MOUNTS = [("orders-kafka", {"password": "sasl.password", "user": "sasl.username"})]


def scaling(**raw: Any) -> Autoscaling:
    return parse_operator_spec({"autoscaling": {"enabled": True, **raw}}).autoscaling


def test_off_or_paused_wants_no_autoscaler() -> None:
    body = pipeline_body(source={"topics": ["orders"], "groupId": "g1"})
    off = parse_operator_spec({}).autoscaling
    assert (
        render.wanted_autoscaler(body, parsed(body), off, 4, keda_served=True, kafka_mounts=None)
        is None
    )
    paused = pipeline_body(source={"topics": ["orders"], "groupId": "g1"}, paused=True)
    wanted = render.wanted_autoscaler(
        paused, parsed(paused), scaling(), 4, keda_served=True, kafka_mounts=None
    )
    assert wanted is None


def test_keda_with_a_kafka_secret_gets_a_trigger_authentication_it_refers_to() -> None:
    body = pipeline_body(source={"topics": ["orders"], "groupId": "g1"})
    wanted = render.wanted_autoscaler(
        body, parsed(body), scaling(maxReplicas=8), 4, keda_served=True, kafka_mounts=MOUNTS
    )
    assert wanted is not None
    scaled, auth = wanted
    assert scaled["kind"] == "ScaledObject"
    assert scaled["spec"]["maxReplicaCount"] == 4  # capped at the partition count
    assert auth is not None and auth["kind"] == "TriggerAuthentication"
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}


def test_without_keda_or_a_prometheus_for_lag_seconds_the_hpa() -> None:
    body = pipeline_body(source={"topics": ["orders"], "groupId": "g1"})
    hpa, auth = render.wanted_autoscaler(
        body, parsed(body), scaling(), None, keda_served=False, kafka_mounts=MOUNTS
    ) or ({}, None)
    assert (hpa["kind"], auth) == ("HorizontalPodAutoscaler", None)
    seconds = scaling(targetLagSeconds=30)  # no prometheusAddress: KEDA could not ask
    hpa, auth = render.wanted_autoscaler(
        body, parsed(body), seconds, None, keda_served=True, kafka_mounts=MOUNTS
    ) or ({}, None)
    assert (hpa["kind"], auth) == ("HorizontalPodAutoscaler", None)


def test_scaled_events_say_which_autoscaler_and_the_lag_against_its_target() -> None:
    seconds = parse_operator_spec({"autoscaling": {"enabled": True, "targetLagSeconds": 30}})
    status = {"lag": 1200, "lagSeconds": 45.5}
    assert render.scaling_reason("HorizontalPodAutoscaler", seconds, status) == (
        " (autoscaler: HorizontalPodAutoscaler; lag 45.5 s, target 30 s)"
    )
    messages = parse_operator_spec({"autoscaling": {"enabled": True}})
    assert render.scaling_reason("ScaledObject", messages, status) == (
        " (autoscaler: ScaledObject; lag 1200 messages, target 1000 per worker)"
    )
    assert render.scaling_reason(None, messages, status) == ""
