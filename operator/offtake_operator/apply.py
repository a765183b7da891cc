"""Make a child object in the cluster match its rendering, by server-side apply.

Offtake applies each child as its own field manager (``offtake``), so a field the rendering
no longer has (a removed node selector, annotation, env var) disappears from the child, while
fields that other managers own (an HPA's or ``kubectl scale``'s replicas on objects Offtake
does not render replicas for, the API server's defaults) stay.

A pass that would change nothing sends nothing: the rendering carries its own checksum in an
annotation, and a child that has that checksum and every rendered field with the same value is
left alone. A changed replica count, image or annotation is drift and gets applied back.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .kubeapi import JSON, ApiError, KubeApi, Resource
from .names import APPLIED_ANNOTATION

Action = Literal["created", "updated", "unchanged"]


@dataclass(frozen=True)
class Applied:
    action: Action
    #: The object as the server has it after this call.
    obj: JSON
    #: The object as it was before (None if this call created it).
    before: JSON | None = None


class NotOursError(Exception):
    """A child's name is taken by an object another controller owns."""


def covers(actual: Any, desired: Any) -> bool:
    """Whether ``actual`` has every field of ``desired`` with an equal value."""
    if isinstance(desired, Mapping):
        if not isinstance(actual, Mapping):
            return False
        return all(k in actual and covers(actual[k], v) for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(actual, list) or len(actual) != len(desired):
            return False
        return all(covers(a, d) for a, d in zip(actual, desired, strict=True))
    if isinstance(desired, bool) or isinstance(actual, bool):
        return actual is desired
    return bool(actual == desired)


def stamped(desired: Mapping[str, Any]) -> JSON:
    """``desired`` with the checksum of its own content in an annotation: a child whose
    checksum differs was applied from another rendering (a field may have been removed since),
    which :func:`covers` alone cannot see."""
    text = json.dumps(desired, sort_keys=True, separators=(",", ":"))
    meta = dict(desired["metadata"])
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        APPLIED_ANNOTATION: hashlib.sha256(text.encode()).hexdigest()[:32],
    }
    return {**desired, "metadata": meta}


def _controller_uid(obj: Mapping[str, Any]) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def _describe(res: Resource, desired: Mapping[str, Any]) -> str:
    m = desired["metadata"]
    return f"{res.kind} {m.get('namespace')}/{m['name']}"


async def ensure(api: KubeApi, res: Resource, desired: Mapping[str, Any]) -> Applied:
    """Apply ``desired`` unless the existing object already is its rendering."""
    body = stamped(desired)
    m = body["metadata"]
    namespace, name = m.get("namespace"), m["name"]
    # Looked at first: force-applying over an object another controller owns would take it.
    actual = await api.get(res, namespace, name)
    if actual is not None:
        owner = _controller_uid(actual)
        want = m.get("ownerReferences") or [{}]
        if owner is not None and owner != want[0].get("uid"):
            raise NotOursError(
                f"{_describe(res, desired)} already exists and is controlled by another owner "
                f"(uid {owner}); rename or delete it"
            )
        if covers(actual, body):
            return Applied("unchanged", actual, actual)
    try:
        obj = await api.apply(res, namespace, name, body)
    except ApiError as exc:
        # A server without server-side apply (the tests' API emulator) answers 404 for an
        # object that does not exist yet: create it.
        if exc.status != 404 or actual is not None:
            raise
        obj = await api.create(res, namespace, body)
    return Applied("created" if actual is None else "updated", obj, actual)


async def remove_owned(
    api: KubeApi, res: Resource, namespace: str, name: str, owner_uid: str
) -> bool:
    """Delete a child this pipeline owns (and nothing else); False if there was none."""
    actual = await api.get(res, namespace, name)
    if actual is None or _controller_uid(actual) != owner_uid:
        return False
    return await api.delete(res, namespace, name)
