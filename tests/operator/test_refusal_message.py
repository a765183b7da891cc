"""The message of a refused child (offtake_operator.refusal) and which API errors count as a
refusal. The server's answers here are the ones kube-apiserver 1.34 gave on the test bed
(tests/e2e/test_operator_refused_child.py shows them end to end)."""

from __future__ import annotations

import base64

from offtake_operator.ensure import describe_error
from offtake_operator.kubeapi import DEPLOYMENTS, SECRETS, ApiError, Cause
from offtake_operator.refusal import (
    CAUSES_SHOWN,
    MESSAGE_LIMIT,
    REDACTED,
    refusal_message,
    typed_patch_causes,
)

PATH = "/apis/apps/v1/namespaces/shop/deployments/orders"


def error(status: int, reason: str, message: str, causes: tuple[Cause, ...] = ()) -> ApiError:
    return ApiError("PATCH", PATH, status, reason, message, causes)


def test_the_servers_causes_name_each_field() -> None:
    exc = error(
        422,
        "Invalid",
        'Deployment.apps "orders" is invalid: spec.template.spec.containers[0].env[3].name: '
        "Required value",
        (Cause("spec.template.spec.containers[0].env[3].name", "Required value"),),
    )
    assert refusal_message("Deployment", "orders", exc) == (
        "Deployment orders was rejected by the API server (422 Invalid): "
        "spec.template.spec.containers[0].env[3].name: Required value"
    )


def test_server_side_applys_typed_patch_500_names_its_field_paths() -> None:
    one = (
        "failed to create typed patch object (shop/orders; apps/v1, Kind=Deployment): "
        '.spec.template.spec.containers[name="worker"].env: duplicate entries for key '
        '[name="X"]'
    )
    exc = error(500, "Internal Server Error", one)
    assert exc.body_refused and not exc.retriable  # the same body fails every time
    assert refusal_message("Deployment", "orders", exc) == (
        "Deployment orders was rejected by the API server (500 Internal Server Error): "
        'spec.template.spec.containers[name="worker"].env: duplicate entries for key [name="X"]'
    )
    # Several errors come as a list (kubernetes#121575), a key's value may hold ": ".
    several = (
        "failed to create typed patch object (shop/orders; apps/v1, Kind=Deployment): errors:\n"
        '  .spec.template.spec.containers[name="c: d"].env: duplicate entries for key '
        '[name="FOO"]\n'
        '  .spec.template.spec.containers[name="c: d"].ports: duplicate entries for key '
        '[containerPort=93,protocol="TCP"]'
    )
    assert [(c.field, c.message) for c in typed_patch_causes(several)] == [
        (
            'spec.template.spec.containers[name="c: d"].env',
            'duplicate entries for key [name="FOO"]',
        ),
        (
            'spec.template.spec.containers[name="c: d"].ports',
            'duplicate entries for key [containerPort=93,protocol="TCP"]',
        ),
    ]


def test_which_errors_are_refusals_and_which_are_tried_again() -> None:
    quantity = (
        "failed to convert new object (shop/orders; apps/v1, Kind=Deployment) to proper "
        "version: unable to convert unstructured object to apps/v1, Kind=Deployment: "
        "quantities must match the regular expression"
    )
    assert error(500, "Internal Server Error", quantity).body_refused
    assert error(500, "InternalError", "etcdserver: request timed out").retriable
    assert error(503, "ServiceUnavailable", "failed to create typed patch object").retriable
    for status in (400, 403, 422):
        assert not error(status, "x", "y").retriable
    for status in (401, 409, 429, 500, 504):
        assert error(status, "x", "y").retriable


def test_a_webhooks_denial_keeps_who_denied_it_and_a_quota_its_own_words() -> None:
    webhook = error(
        400,
        "BadRequest",
        'admission webhook "images.example.com" denied the request: image: not allowed',
        (Cause("spec.template.spec.containers[0].image", "not allowed"),),
    )
    assert refusal_message("Deployment", "orders", webhook) == (
        "Deployment orders was rejected by the API server (400 BadRequest): admission webhook "
        '"images.example.com" denied the request: spec.template.spec.containers[0].image: '
        "not allowed"
    )
    quota = error(
        403,
        "Forbidden",
        'configmaps "orders-pipeline" is forbidden: exceeded quota: cms, requested: '
        "count/configmaps=1, used: count/configmaps=1, limited: count/configmaps=1",
    )
    assert refusal_message("ConfigMap", "orders-pipeline", quota).endswith(
        "(403 Forbidden): " + quota.message
    )


def test_the_message_is_one_line_and_bounded_whatever_the_server_says() -> None:
    hostile = error(400, "BadRequest", "denied\n\x1b[31m" + "x" * 5_000_000)
    text = refusal_message("Deployment", "orders", hostile)
    assert len(text) == MESSAGE_LIMIT and text.endswith("…")
    assert text.isprintable()
    assert "denied [31mxxx" in text
    causes = tuple(Cause(f"spec.f{i}", "bad") for i in range(30))
    text = refusal_message("Deployment", "orders", error(422, "Invalid", "m", causes))
    assert text.count("spec.f") == CAUSES_SHOWN
    assert text.endswith(f"; and {30 - CAUSES_SHOWN} more")
    assert len(text) <= MESSAGE_LIMIT


def test_a_secrets_values_never_appear() -> None:
    token = "s3cr3t-token-value-0123456789"
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "orders-spark-token"},
        "data": {"token": base64.b64encode(token.encode()).decode()},
        "stringData": {"other": "another-value-9876"},
    }
    encoded = secret["data"]["token"]  # type: ignore[index]
    said = f'data[token]: Invalid value: "{token}" and "{encoded}" and "another-value-9876"'
    with_causes = error(
        422,
        "Invalid",
        f'Secret "orders-spark-token" is invalid: {said}',
        (Cause("data[token]", f'Invalid value: "{token[:9]}', "FieldValueInvalid"),),
    )
    text = describe_error(SECRETS, secret, with_causes)
    assert text == (
        "Secret orders-spark-token was rejected by the API server (422 Invalid): "
        "data[token]: FieldValueInvalid"
    )
    # Without causes: only who refused, never the server's text (it may quote a value, cut).
    webhook = error(400, "BadRequest", f'admission webhook "w" denied the request: {said}')
    text = describe_error(SECRETS, secret, webhook)
    assert text.endswith('(400 BadRequest): admission webhook "w" denied the request')
    # Any other kind keeps the server's words (nothing secret is rendered into it); values
    # given to hide are still removed from them.
    plain = refusal_message("Deployment", "orders", error(400, "BadRequest", said), [token])
    assert token not in plain and REDACTED in plain
    kept = describe_error(DEPLOYMENTS, {"metadata": {"name": "orders"}}, error(400, "B", said))
    assert kept.endswith(f"(400 B): {said}")
