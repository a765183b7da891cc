"""Make a child object in the cluster match its rendering: create, patch, or leave it alone.

The comparison is "is every field we render present with the same value": the API server
adds defaults (a container's terminationMessagePath, a probe's scheme, ...) that are not
drift, while a changed replica count, image or annotation is, and gets patched back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .kubeapi import JSON, ApiError, KubeApi, Resource

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


def _controller_uid(obj: Mapping[str, Any]) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def _describe(res: Resource, desired: Mapping[str, Any]) -> str:
    m = desired["metadata"]
    return f"{res.kind} {m.get('namespace')}/{m['name']}"


async def ensure(
    api: KubeApi, res: Resource, desired: Mapping[str, Any], *, create_first: bool = False
) -> Applied:
    """Create ``desired`` or patch the existing object until it covers ``desired``.

    ``create_first`` tries the create before looking: one round trip less for a pipeline
    that is new (the common case on its first pass), a conflict and a read if it is not.
    """
    m = desired["metadata"]
    namespace, name = m.get("namespace"), m["name"]
    actual = None if create_first else await api.get(res, namespace, name)
    if actual is None:
        try:
            return Applied("created", await api.create(res, namespace, desired), None)
        except ApiError as exc:
            if exc.status != 409:  # 409: created meanwhile (another reconcile); patch it below
                raise
            actual = await api.get(res, namespace, name)
            if actual is None:
                raise
    want = (desired.get("metadata") or {}).get("ownerReferences") or [{}]
    owner = _controller_uid(actual)
    if owner is not None and owner != want[0].get("uid"):
        raise NotOursError(
            f"{_describe(res, desired)} already exists and is controlled by another owner "
            f"(uid {owner}); rename or delete it"
        )
    if covers(actual, desired):
        return Applied("unchanged", actual, actual)
    patch = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind")}
    return Applied("updated", await api.patch(res, namespace, name, patch), actual)


async def remove_owned(
    api: KubeApi, res: Resource, namespace: str, name: str, owner_uid: str
) -> bool:
    """Delete a child this pipeline owns (and nothing else); False if there was none."""
    actual = await api.get(res, namespace, name)
    if actual is None or _controller_uid(actual) != owner_uid:
        return False
    return await api.delete(res, namespace, name)
