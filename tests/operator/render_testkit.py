"""What the render tests share: an operator configuration and the worker's Deployment."""

from __future__ import annotations

from typing import Any

from offtake.config import parse_pipeline
from offtake_operator import render
from offtake_operator.reconcile import worker_manifest
from offtake_operator.settings import OperatorConfig

CONFIG = OperatorConfig(worker_image="registry.test/offtake:1.2.3")


def parsed(body: dict[str, Any]) -> Any:
    return parse_pipeline(worker_manifest(body))


def deployment(body: dict[str, Any], replicas: int | None = None) -> dict[str, Any]:
    p = parsed(body)
    return render.render_deployment(
        body, p, CONFIG, replicas=p.replicas if replicas is None else replicas
    )


def pod_spec(body: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment(body)["spec"]["template"]["spec"]
    return spec
