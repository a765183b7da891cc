"""Make a child object in the cluster match its rendering, by server-side apply.

Offtake applies each child as its own field manager (``offtake``), so a field the rendering
no longer has (a removed node selector, annotation, env var) disappears from the child, while
fields that other managers own (an HPA's or ``kubectl scale``'s replicas on objects Offtake
does not render replicas for, the API server's defaults) stay.

Offtake changes only what it made (docs/operator.md, "Which objects the operator changes"):
an object already carrying a child's name is adopted only when it carries this pipeline's uid
in an ownerReference, or Offtake's labels for this pipeline (managed-by offtake-operator and
``offtake.dev/pipeline=<name>``, in the pipeline's namespace: a child left from an earlier
pipeline of that name). Anything else (made by Helm, kubectl, another team) is left exactly
as it is, never applied to and never given an ownerReference, so the garbage collector cannot
reach it when the pipeline goes: :class:`NotOursError` names it and the reconcile turns that
into a condition and an Event. Deleting follows the same rule (:func:`remove_owned`).

A pass that would change nothing sends nothing: the rendering carries its own checksum in an
annotation, and a child that has that checksum and every rendered field with the same value is
left alone. A changed replica count, image or annotation is drift and gets applied back.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .errors import OperatorError
from .kubeapi import JSON, ApiError, KubeApi, Resource
from .names import APPLIED_ANNOTATION, KIND, MANAGED_BY, PIPELINE_LABEL

Action = Literal["created", "updated", "unchanged"]


@dataclass(frozen=True)
class Applied:
    action: Action
    #: The object as the server has it after this call.
    obj: JSON
    #: The object as it was before (None if this call created it).
    before: JSON | None = None


@dataclass(frozen=True)
class Taken:
    """An object holding a child's name that this pipeline did not make."""

    kind: str
    #: namespace/name
    where: str
    why: str

    def __str__(self) -> str:
        return f"{self.kind} {self.where} already exists and {self.why}"


class NotOursError(OperatorError):
    """Children's names are taken by objects this pipeline did not make: Offtake leaves them
    alone. ``taken`` names each (kind, namespace/name) for the condition and the Event."""

    def __init__(self, taken: Sequence[Taken]) -> None:
        self.taken = list(taken)
        kinds = " or ".join(sorted({t.kind for t in self.taken}))
        super().__init__(
            "; ".join(str(t) for t in self.taken)
            + f". Offtake changes nothing on it: rename the pipeline, or delete that {kinds} "
            f"(or label it {_MANAGED_BY_KEY}={MANAGED_BY} and {PIPELINE_LABEL}=<pipeline> to "
            "hand it over)"
        )


_MANAGED_BY_KEY = "app.kubernetes.io/managed-by"


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


def _refs(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((obj.get("metadata") or {}).get("ownerReferences") or [])


def _controller_uid(obj: Mapping[str, Any]) -> str | None:
    for ref in _refs(obj):
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def carries_uid(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether ``obj`` has an ownerReference (controller or not) to the object with ``uid``."""
    return any(str(ref.get("uid")) == uid for ref in _refs(obj))


def has_offtake_labels(obj: Mapping[str, Any], pipeline: str, namespace: str | None) -> bool:
    """Whether ``obj`` carries Offtake's labels for ``pipeline`` in ``namespace``: managed by the
    operator and labelled with the pipeline's name. Enough to adopt it: setting labels on an
    object takes update rights on it, which already allow deleting or rewriting it, so a
    labelled object gives nobody more than they had."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    return (
        labels.get(_MANAGED_BY_KEY) == MANAGED_BY
        and labels.get(PIPELINE_LABEL) == pipeline
        and meta.get("namespace") == namespace
    )


def refusal(actual: Mapping[str, Any], desired: Mapping[str, Any]) -> str | None:
    """Why ``actual`` (the object holding a child's name) is not this pipeline's to change, or
    None when it is. ``desired`` is the rendering: its ownerReference names the pipeline."""
    meta = desired["metadata"]
    (owner,) = [r for r in meta.get("ownerReferences") or [] if r.get("kind") == KIND]
    uid = str(owner["uid"])
    if carries_uid(actual, uid):
        return None
    controller = _controller_uid(actual)
    if controller is not None:
        # Labels never override another controller: two controllers would fight over it.
        return f"is controlled by another owner (uid {controller})"
    if has_offtake_labels(actual, str(owner["name"]), meta.get("namespace")):
        return None  # left by an earlier pipeline of this name: adopted
    return (
        f"was not made by ConsumerPipeline {owner['name']} (no ownerReference to its uid "
        f"{uid} and no {_MANAGED_BY_KEY}={MANAGED_BY}, {PIPELINE_LABEL}={owner['name']} labels)"
    )


def _where(desired: Mapping[str, Any]) -> str:
    m = desired["metadata"]
    return f"{m.get('namespace')}/{m['name']}"


async def claim(
    api: KubeApi, res: Resource, desired: Mapping[str, Any], known: JSON | None = None
) -> JSON | None:
    """The object holding ``desired``'s name if this pipeline may change it (None: there is
    none); :class:`NotOursError` if it may not. Looked at before any write: force-applying over
    an object someone else made would take it (and the ownerReference would hand it to the
    garbage collector with the pipeline). ``known``: the object as the watch last sent it, read
    from the API server only without it."""
    m = desired["metadata"]
    actual = known if known is not None else await api.get(res, m.get("namespace"), m["name"])
    if actual is not None:
        why = refusal(actual, desired)
        if why is not None:
            raise NotOursError([Taken(res.kind, _where(desired), why)])
    return actual


async def apply_claimed(
    api: KubeApi, res: Resource, desired: Mapping[str, Any], actual: JSON | None
) -> Applied:
    """Apply ``desired`` over ``actual`` (what :func:`claim` returned) unless it already is
    its rendering."""
    body = stamped(desired)
    m = body["metadata"]
    namespace, name = m.get("namespace"), m["name"]
    if actual is not None and covers(actual, body):
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


async def ensure(api: KubeApi, res: Resource, desired: Mapping[str, Any]) -> Applied:
    """Apply ``desired`` unless the existing object already is its rendering; refuse (and
    change nothing) if the existing object is not this pipeline's."""
    return await apply_claimed(api, res, desired, await claim(api, res, desired))


async def remove_owned(
    api: KubeApi, res: Resource, namespace: str, name: str, owner_uid: str
) -> bool:
    """Delete a child that carries this pipeline's uid (and nothing else: labels are not
    enough to delete); False if there was none. The uid precondition makes the API server
    refuse the delete if the name was taken by another object since the read."""
    actual = await api.get(res, namespace, name)
    if actual is None or not carries_uid(actual, owner_uid):
        return False
    return await api.delete(res, namespace, name, uid=str(actual["metadata"].get("uid") or ""))
