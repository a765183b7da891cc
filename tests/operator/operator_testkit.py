"""Shared builders for the operator's fast tests."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def example(
    name: str, *, namespace: str = "shop", uid: str = "uid-1", generation: int = 1
) -> dict[str, Any]:
    """An examples/ manifest as the API server would hand it out (namespace, uid, generation)."""
    body = yaml.safe_load((EXAMPLES / name).read_text())
    body["metadata"].update(namespace=namespace, uid=uid, generation=generation)
    return dict(body)


def pipeline_body(
    name: str = "orders",
    *,
    namespace: str = "shop",
    uid: str = "uid-1",
    generation: int = 1,
    **spec: Any,
) -> dict[str, Any]:
    base: dict[str, Any] = {
        "kafka": {"bootstrapServers": "kafka:9092"},
        "source": {"topics": ["orders"]},
        "sink": {"log": {}},
        "replicas": 2,
    }
    base.update(copy.deepcopy(spec))
    return {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "generation": generation,
            "resourceVersion": "1",
        },
        "spec": base,
    }
