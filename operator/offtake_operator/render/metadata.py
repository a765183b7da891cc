"""Names and labels every child carries: its metadata, its owner reference, a text's checksum."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from .. import names
from ..names import API_VERSION, KIND

JSON = dict[str, Any]


def meta(body: Mapping[str, Any]) -> tuple[str, str]:
    m = body["metadata"]
    return str(m["name"]), str(m.get("namespace") or "default")


def checksum(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def owner_reference(body: Mapping[str, Any]) -> JSON:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": body["metadata"]["name"],
        "uid": body["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def labels(pipeline: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "offtake",
        "app.kubernetes.io/instance": pipeline,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": names.MANAGED_BY,
        names.PIPELINE_LABEL: pipeline,
        names.COMPONENT_LABEL: component,
    }


def child_metadata(body: Mapping[str, Any], name: str, component: str) -> JSON:
    pipeline, namespace = meta(body)
    return {
        "name": name,
        "namespace": namespace,
        "labels": labels(pipeline, component),
        "ownerReferences": [owner_reference(body)],
    }
