"""kopf handlers: when to reconcile. What a reconcile does lives in :mod:`.reconcile`.

Triggers, all funnelled into the same per-pipeline, serialised, coalesced reconcile:

- create / update / resume of a ConsumerPipeline (kopf retries these on errors);
- any change to a child (Deployment, ConfigMap, Service, PDB, redrive Job) carrying the
  pipeline label, so a deleted or edited child is repaired at once and readiness shows up in
  status quickly (not a change of a PDB's or Service's status, which nothing reads); the
  passes read these children from the watch's copies (:attr:`.OperatorContext.children`);
- a periodic tick per pipeline that reconciles every ``OFFTAKE_RESYNC_SECONDS`` (drift the
  watches missed) and measures lag every ``OFFTAKE_LAG_INTERVAL_SECONDS``.

Run with ``offtake-operator`` (see :mod:`.main`) or ``kopf run -m offtake_operator.handlers``.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import kopf
import kubernetes.config

from . import kubeapi, metrics, names, reconcile
from .context import WATCHED_CHILDREN, OperatorContext, context_of
from .names import GROUP, PLURAL, VERSION

#: How often each pipeline's daemon wakes to see whether a resync or a lag measurement is due.
TICK_SECONDS = float(os.environ.get("OFFTAKE_TICK_SECONDS", "5"))

_WATCHED_BY_PLURAL = {res.plural: res for res in WATCHED_CHILDREN}


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    ctx = context_of(memo)  # created here, in the root memo that every handler's memo copies
    # Progress and diff-base in annotations: the CRD's status schema is structural, so kopf's
    # own status.kopf field would be pruned by the API server.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # kopf puts a finalizer on every object with a daemon, to stop it before the object
    # goes. A tick in flight at deletion is waited for: check back soon, not after 60 s.
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.background.cancellation_polling = 1.0
    settings.posting.reporting_component = names.MANAGED_BY
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # Watch only our children, server-side: never every ConfigMap in the cluster.
    for res in WATCHED_CHILDREN:
        settings.watching.label_selectors[res.api_version, res.plural] = names.PIPELINE_LABEL
    # Pods: only those the injection webhook patched (inject mode's status).
    settings.watching.label_selectors["v1", "pods"] = names.INJECTED_LABEL
    if ctx.config.peering:
        settings.peering.name = ctx.config.peering
        settings.peering.mandatory = True
        settings.peering.clusterwide = not ctx.config.namespaces
        settings.peering.stealth = True
        settings.peering.lifetime = ctx.config.peering_lifetime_seconds


@kopf.on.login()
def login(memo: Any, settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
    """One login for kopf and for the client of the children: the ``kubernetes`` client loads
    the credentials (:func:`.kubeapi.load_configuration`), the children's client uses them and
    kopf gets the same, read off the configuration as kopf's own ``login_via_client`` does.
    Not ``login_via_client`` itself: it loads into the client's process-wide default and reads
    $KUBECONFIG when the client is imported, while an embedded operator serves the cluster of
    $KUBECONFIG as it is when the operator starts."""
    try:
        configuration = kubeapi.load_configuration()
    except kubernetes.config.ConfigException as exc:
        raise kopf.LoginError(f"no credentials: not in a pod, and no kubeconfig ({exc})") from exc
    context_of(memo).api.use(configuration)
    header = configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
    scheme, _space, token = (header or "").rpartition(" ")
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme or None,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        trust_env=settings.networking.trust_env,
    )


@kopf.on.cleanup()
async def close(memo: Any, **_: Any) -> None:
    ctx = context_of(memo)
    ctx.closed = True
    await ctx.api.close()


async def run_reconcile(
    ctx: OperatorContext, namespace: str, name: str, *, coalesce: bool
) -> reconcile.ReconcileResult | None:
    """Reconcile under the pipeline's lock. With ``coalesce``, a trigger that arrives while
    another pass is already waiting is dropped: that pass reads the object afresh anyway."""
    state = ctx.state(namespace, name)
    if coalesce and state.queued:
        return None
    state.queued = True
    async with state.lock, ctx.api_slots:
        # Queued until a slot is free: triggers meanwhile are covered by this pass's fresh read.
        state.queued = False
        began = time.monotonic()
        try:
            outcome = await reconcile.reconcile(ctx, namespace, name)
        except Exception:
            metrics.RECONCILES.labels("error").inc()
            raise
        finally:
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - began)
        metrics.RECONCILES.labels(_result(outcome)).inc()
        state.last_reconcile = time.monotonic()
    if outcome.gone:
        ctx.forget(namespace, name)
    return outcome


def _result(outcome: reconcile.ReconcileResult) -> str:
    phase = outcome.status.get("phase")
    if phase == "Failed":
        return "rejected"
    reasons = [
        c.get("reason")
        for c in outcome.status.get("conditions") or []
        if c.get("type") == "Degraded" and c.get("status") == "True"
    ]
    return "invalid" if "InvalidSpec" in reasons else "ok"


@kopf.on.resume(GROUP, VERSION, PLURAL, backoff=5)
@kopf.on.create(GROUP, VERSION, PLURAL, backoff=5)
@kopf.on.update(GROUP, VERSION, PLURAL, backoff=5)
async def pipeline_changed(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    outcome = await run_reconcile(context_of(memo), namespace or "default", name, coalesce=False)
    if outcome is not None and outcome.retry_after is not None:
        # kopf calls this handler again after the delay: the next step of a rewind.
        raise kopf.TemporaryError(outcome.message or "waiting", delay=outcome.retry_after)


def _deleted(type: str | None, **_: Any) -> bool:
    return type == "DELETED"


# Only deletions: kopf would otherwise invoke (and log) this for every event of every pipeline.
@kopf.on.event(GROUP, VERSION, PLURAL, when=_deleted)
async def pipeline_event(type: str, name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    if type == "DELETED":
        ctx = context_of(memo)
        ctx.forget(namespace or "default", name)
        await reconcile.report_orphaned_pods(ctx, namespace or "default", name)


@kopf.on.event("v1", "pods", labels={names.INJECTED_LABEL: kopf.PRESENT}, id="injected-pods")
async def injected_pod_changed(
    type: str | None, body: kopf.Body, namespace: str | None, memo: Any, **_: Any
) -> None:
    """mode inject: a pod with the worker came, went or changed readiness: update status."""
    pipeline = (body.get("metadata", {}).get("labels") or {}).get(names.PIPELINE_LABEL)
    if not pipeline or namespace is None or type is None:  # type None: the initial listing
        return
    await run_reconcile(context_of(memo), namespace, pipeline, coalesce=True)


# A daemon rather than a kopf timer: a timer's every wake goes through kopf's handler machinery
# (kwargs, invocation, a log line), a fifth of a core for a thousand pipelines ticking every
# 5 s; a daemon's wake is one coroutine step. kopf stops it like a timer (deletion, peering).
@kopf.daemon(GROUP, VERSION, PLURAL, initial_delay=TICK_SECONDS)
async def ticker(
    name: str,
    namespace: str | None,
    body: kopf.Body,
    memo: Any,
    stopped: kopf.DaemonStopped,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    ctx = context_of(memo)
    while not stopped and not ctx.closed:
        try:
            # body: kopf keeps a daemon's body up to date with the watch.
            await tick(ctx, namespace or "default", name, body)
        except Exception as exc:  # a failed tick (an API timeout) is retried at the next one
            logger.warning(f"tick failed, next in {TICK_SECONDS:g}s: {exc!r}")
        await stopped.wait(TICK_SECONDS)


async def tick(ctx: OperatorContext, namespace: str, name: str, body: kopf.Body) -> None:
    """A resync or a lag measurement, if one is due."""
    state = ctx.state(namespace, name)
    now = time.monotonic()
    if now - state.last_reconcile >= ctx.config.resync_seconds:
        await run_reconcile(ctx, namespace, name, coalesce=True)
    # Lag only once a pass has run: while passes queue (a thousand new pipelines), lag writes
    # would only compete with them.
    first_pass_done = state.last_reconcile > float("-inf")
    lag_due = now - state.last_lag >= ctx.config.lag_interval_seconds
    if ctx.config.lag_source == "kafka" and first_pass_done and lag_due:
        state.last_lag = now
        partitions_changed = await reconcile.refresh_lag(ctx, body)
        if partitions_changed:  # the autoscaler's ceiling follows the partition count
            await run_reconcile(ctx, namespace, name, coalesce=True)


def _owner(body: kopf.Body) -> str | None:
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == names.KIND and ref.get("controller"):
            return str(ref.get("name"))
    return None


async def _child_changed(
    type: str | None,
    body: kopf.Body,
    resource: kopf.Resource,
    namespace: str | None,
    memo: Any,
    **_: Any,
) -> None:
    ctx = context_of(memo)
    res = _WATCHED_BY_PLURAL[resource.plural]
    if type == "DELETED":
        ctx.drop_child(res, str(namespace), str(body.get("metadata", {}).get("name")))
    else:
        ctx.note_child(res, body)  # the passes read it from here
    owner = _owner(body)
    if owner is None or namespace is None:
        return
    await run_reconcile(ctx, namespace, owner, coalesce=True)


def _news(type: str | None, body: kopf.Body, resource: kopf.Resource, memo: Any, **_: Any) -> bool:
    """Not a version the operator knows (the echo of its own write), nor a change of a status
    no pass reads (:meth:`.OperatorContext.knows`): a filter, so that kopf does not even invoke
    the handler for the several echoes of each pass."""
    known = context_of(memo).knows(_WATCHED_BY_PLURAL[resource.plural], body)
    return type == "DELETED" or not known


for _res in WATCHED_CHILDREN:
    kopf.on.event(
        *((_res.group, _res.version, _res.plural) if _res.group else (_res.version, _res.plural)),
        labels={names.PIPELINE_LABEL: kopf.PRESENT},
        id=f"child-{_res.plural}",
        when=_news,
    )(_child_changed)
