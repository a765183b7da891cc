"""Redrive: replay a pipeline's dead letters through it, once per ``spec.redrive.id``.

The work is ``offtake redrive`` (:mod:`offtake.redrive`), run as a Job the pipeline owns
(``<name>-redrive``), with the workers' image, ConfigMap, Kafka credentials and restricted
security contexts. The workers keep running: the replayed records land in their source topics
and are consumed like any other.

One :func:`advance` per reconcile pass (:mod:`offtake_operator.reconcile`), recomputed from
spec, status, the Job and Kafka each time, so an operator restart resumes where it was:

1. ``spec.redrive.id`` differs from ``status.redrive.lastId``: the redrive is pending. The
   dead-letter topic must exist (else a Warning naming ``spec.redrive.from``, and nothing runs
   until it does or the request changes).
2. A Job of another id (an earlier redrive) is deleted, in the foreground: once it and its pods
   are gone, the Job of this id is created (``RedriveStarted``).
3. The Job completes: the totals (replayed, left, skipped, rejected) are read from the
   redrive's consumer group, whose commits carry them, and the id is recorded in
   ``status.redrive.lastId`` (``RedriveCompleted``). A failed Job (its retries exhausted) is
   reported (``RedriveFailed``); a new id retries, resuming from the group's commits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from offtake.contract import PipelineSpec, RedriveRequest, RedriveResult, redrive_group

from . import names, render
from .apply import NotOursError, Taken, carries_uid, ensure
from .context import OperatorContext
from .kafka_secret import KafkaSecret
from .kubeapi import JOBS
from .lag import KafkaAccessError
from .status import Event, now_rfc3339


def pending(request: RedriveRequest | None, status: Mapping[str, Any]) -> bool:
    """Whether ``request`` still has to run (its id is not the last one that completed)."""
    done = (status.get("redrive") or {}).get("lastId")
    return request is not None and request.id != done


@dataclass
class Step:
    """Where one :func:`advance` left the redrive."""

    #: ``status.redrive`` to merge-patch (None values delete fields).
    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    done: bool = False


def _job_state(job: Mapping[str, Any]) -> tuple[str, str]:
    """("Complete" | "Failed" | "Running", message) from the Job's conditions."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return "Complete", ""
        if cond.get("type") == "Failed":
            reason = cond.get("reason") or "Failed"
            return "Failed", f"{reason}: {cond.get('message') or 'the Job failed'}"
    return "Running", ""


async def advance(
    ctx: OperatorContext,
    body: Mapping[str, Any],
    pipeline: PipelineSpec,
    request: RedriveRequest,
    secret: KafkaSecret | None,
    old_status: Mapping[str, Any],
) -> Step:
    """One step of a pending redrive."""
    name, namespace = render.meta(body)
    old = old_status.get("redrive") or {}
    group = redrive_group(pipeline.source.group_id)
    job_name = names.redrive_job_name(name)
    described = f"redrive {request.id} of {request.source} until {request.until_text}"
    base: dict[str, Any] = {
        "activeId": request.id,
        "from": request.source,
        "until": request.until_text,
        "job": job_name,
    }

    def step(message: str, *events: Event, **extra: Any) -> Step:
        return Step({**base, "message": message, **extra}, list(events))

    def warn_once(message: str) -> Step:
        # Posted when the message changes, not on every resync.
        fresh = old.get("activeId") != request.id or old.get("message") != message
        return step(message, *([Event("Warning", "RedriveFailed", message)] if fresh else []))

    properties = {} if secret is None else secret.properties
    try:
        progress = await ctx.kafka.redrive_progress(
            pipeline, properties, group, request.source, request.id
        )
    except KafkaAccessError as exc:
        return step(f"{described}: waiting for Kafka: {exc}")
    if progress is None:
        return warn_once(
            f"spec.redrive.from: the dead-letter topic {request.source!r} does not exist"
        )

    job = await ctx.api.get(JOBS, namespace, job_name)
    if job is not None:
        _check_ours(body, job)
    job_id = (
        ((job or {}).get("metadata") or {}).get("annotations", {}).get(names.REDRIVE_ID_ANNOTATION)
    )
    if job is not None and job_id != request.id:
        # An earlier redrive's Job (done, failed or superseded). Foreground: the Job stays until
        # its pods are gone, so a superseded redrive still running has stopped before this one
        # starts from the group's position (two at once would replay the same batch).
        if not (job.get("metadata") or {}).get("deletionTimestamp"):
            await ctx.api.delete(
                JOBS,
                namespace,
                job_name,
                propagation="Foreground",
                uid=str(job["metadata"].get("uid") or ""),
            )
        return step(f"{described}: waiting for the Job of redrive {job_id} to be removed")
    if job is None:
        rendered = render.render_redrive_job(
            body,
            pipeline,
            ctx.config,
            request,
            group,
            kafka_mounts=None if secret is None else secret.mounts,
        )
        applied = await ensure(ctx.api, JOBS, rendered)
        ctx.note_child(JOBS, applied.obj)
        message = f"{described}: Job {job_name} started (group {group})"
        return step(message, Event("Normal", "RedriveStarted", message))

    state, why = _job_state(job)
    if state == "Failed":
        return warn_once(f"{described}: Job {job_name} failed: {why}")
    if state == "Running":
        return step(f"{described}: Job {job_name} running")
    return _completed(base, request, described, progress)


def _check_ours(body: Mapping[str, Any], job: Mapping[str, Any]) -> None:
    """Someone else's Job under our name is neither deleted nor read as ours (its state and
    annotation mean nothing here): NotOursError, which the reconcile reports (NameTaken)."""
    if carries_uid(job, str(body["metadata"]["uid"])):
        return
    name, namespace = render.meta(body)
    why = (
        f"was not made by ConsumerPipeline {name} (no ownerReference "
        f"to its uid {body['metadata']['uid']})"
    )
    raise NotOursError([Taken(JOBS.kind, f"{namespace}/{names.redrive_job_name(name)}", why)])


def _completed(
    base: Mapping[str, Any], request: RedriveRequest, described: str, progress: RedriveResult
) -> Step:
    """The last step: the Job succeeded; its totals into status and the Completed event."""
    totals = progress.totals
    message = (
        f"{described}: replayed {totals.replayed} dead letter(s), left {totals.left} newer "
        f"than until, skipped {totals.skipped} not this pipeline's"
    )
    if totals.rejected:  # headers Offtake did not write: each is named in the Job's log
        message += f", rejected {totals.rejected} with bad headers (see the Job's log)"
    return Step(
        {
            **base,
            "lastId": request.id,
            "activeId": None,  # merge patch: removes the field
            "replayed": totals.replayed,
            "left": totals.left,
            "skipped": totals.skipped,
            "completedAt": now_rfc3339(),
            "message": message,
        },
        [Event("Normal", "RedriveCompleted", message)],
        done=True,
    )
