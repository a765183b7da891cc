"""The PodDisruptionBudget of a pipeline's workers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import names
from .metadata import JSON, child_metadata, meta


def render_pdb(body: Mapping[str, Any]) -> JSON:
    name, _ = meta(body)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": child_metadata(body, names.pdb_name(name), "worker"),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": names.selector(name)}},
    }
