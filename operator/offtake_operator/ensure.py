"""One child claimed and applied within a reconcile pass, and the errors a pass tells apart:
a child the API server refused (:class:`ChildRejectedError`, reported in status), a namespace
being deleted (:class:`NamespaceTerminatingError`, the pass ends quietly), a name held by an
object the pipeline did not make (:class:`.apply.NotOursError`, every such name at once)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from .apply import Applied, NotOursError, Taken, apply_claimed, claim
from .context import OperatorContext
from .errors import OperatorError
from .kubeapi import JSON, SECRETS, ApiError, Resource
from .refusal import refusal_message, secret_values


class ChildRejectedError(OperatorError):
    """The API server refused a rendered child (a malformed image reference, two env entries
    of one name, a quota, an admission webhook, RBAC): the message
    (:func:`.refusal.refusal_message`) names the child and what the server refused."""


class NamespaceTerminatingError(OperatorError):
    """The pipeline's namespace is being deleted: no child can be (re)created there."""


T = TypeVar("T")


async def settled(step: Awaitable[T]) -> T | Exception:
    """``step``'s result, or the exception it raised, as a value.

    For the steps a pass runs at once (``asyncio.gather``): each runs in a task of its own,
    and a task that ends in an exception while the operator stops is re-raised by kopf as the
    operator's crash (it re-raises every task left over at its stop), even though the pass
    would have handled it, as with a namespace being deleted between two tests. A step's task
    that returns its exception ends cleanly; the pass decides what the exception means.
    """
    try:
        return await step
    except Exception as exc:
        return exc


def describe_error(res: Resource, obj: Mapping[str, Any], exc: ApiError) -> str:
    secret = res == SECRETS
    hidden = secret_values(obj) if secret else ()
    return refusal_message(res.kind, obj["metadata"]["name"], exc, hidden, secret=secret)


async def claim_all(
    ctx: OperatorContext, children: list[tuple[Resource, JSON]], trusted: bool
) -> list[JSON | None]:
    """:func:`.apply.claim` for every child at once, before any is written: a name taken by
    an object this pipeline did not make stops the whole set (workers must not start on a
    ConfigMap someone else wrote), and the error names every such object, not the first.
    ``trusted``: the children the watch has sent are taken from :attr:`OperatorContext.children`
    (the others are read)."""
    results = await asyncio.gather(
        *(settled(claim_child(ctx, res, obj, trusted)) for res, obj in children)
    )
    taken: list[Taken] = []
    for result in results:
        if isinstance(result, NotOursError):
            taken += result.taken
        elif isinstance(result, Exception):
            raise result
    if taken:
        raise NotOursError(taken)
    return [r for r in results if not isinstance(r, Exception)]


async def claim_child(ctx: OperatorContext, res: Resource, obj: JSON, trusted: bool) -> JSON | None:
    """:func:`.apply.claim` of one child, from the watch's copy when ``trusted`` (the copy is
    kept up to date with what the claim read otherwise)."""
    m = obj["metadata"]
    known = ctx.child(res, m["namespace"], m["name"]) if trusted else None
    actual = await claim(ctx.api, res, obj, known)
    if known is None:
        if actual is None:
            ctx.drop_child(res, m["namespace"], m["name"])
        else:
            ctx.note_child(res, actual)
    return actual


_UNCLAIMED: Any = object()


async def ensure_child(
    ctx: OperatorContext,
    res: Resource,
    obj: Mapping[str, Any],
    actual: JSON | None = _UNCLAIMED,
) -> Applied:
    """Apply one child; ``actual``: what :func:`claim_all` found (else it is claimed here)."""
    try:
        if actual is _UNCLAIMED:
            actual = await claim(ctx.api, res, obj)
        applied = await apply_claimed(ctx.api, res, obj, actual)
    except ApiError as exc:
        if exc.retriable:  # not a refusal (server-side apply's typed-patch 500 is one)
            raise
        if exc.status == 403 and "being terminated" in exc.message:
            # The namespace is going away, and the pipeline with it: nothing to repair.
            raise NamespaceTerminatingError(str(exc)) from exc
        raise ChildRejectedError(describe_error(res, obj, exc)) from exc
    if applied.action != "unchanged":
        ctx.note_child(res, applied.obj)
    return applied
