"""The mutating admission webhook of ``spec.mode: inject`` (see :mod:`.inject`).

The API server sends every Pod CREATE in the namespaces the webhook configuration selects;
this handler patches only pods annotated ``offtake.dev/pipeline: <name>``:

- no annotation, a namespace the operator does not serve, or a pod that already has the
  worker (a reinvocation): admitted unchanged;
- the pipeline does not exist in the pod's namespace, is not ``mode: inject`` or its spec is
  invalid: **rejected**, with a message naming the annotation and the pipeline. An admitted
  pod without its worker would look healthy and consume nothing; a rejected one shows up at
  once (``kubectl describe rs``: FailedCreate with this message), and the ReplicaSet retries
  with back-off, so the pods come once the pipeline is there.

An operator that is down is a different matter: the configuration says ``failurePolicy:
Ignore``, so the pods are admitted without a worker rather than blocked, and the pipeline's
status (which counts the injected pods) shows that none are consuming.

Served by kopf's own webhook server (``settings.admission.server``) over TLS with the
certificate the Helm chart mounts, behind :class:`.webhook_guard.GuardedWebhookServer`: only
what the API server would send reaches kopf (and, with a client CA configured, only a caller
with the API server's client certificate). The configuration itself is the chart's (kopf's
managed configurations cannot carry a namespaceSelector or objectSelector): the API server
calls the webhook only for pods labelled ``offtake.dev/pipeline``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from offtake.contract import ConfigError, PipelineSpec

from . import group_ids, inject, names
from .context import context_of
from .kafka_secret import KafkaSecretError, read_kafka_secret
from .kubeapi import PIPELINES
from .reconcile import validate
from .settings import OperatorConfig
from .webhook_guard import GuardedWebhookServer

log = logging.getLogger("offtake.operator.webhook")

#: The handler id is the path the webhook configuration's clientConfig points at.
WEBHOOK_ID = "inject-worker"
WEBHOOK_PATH = f"/{WEBHOOK_ID}"

#: The webhook's handlers, apart from kopf's default registry: kopf refuses to run with
#: admission handlers and no webhook server, and injection can be switched off
#: (OFFTAKE_WEBHOOK_PORT unset, the chart's injection.enabled=false).
REGISTRY = kopf.OperatorRegistry()

#: OperatorRegistry's sub-registries (kopf 1.3x-1.4x); each holds a list of handlers.
_SUB_REGISTRIES = ("_activities", "_indexing", "_watching", "_spawning", "_changing", "_webhooks")


def registry_for(config: OperatorConfig) -> kopf.OperatorRegistry:
    """The handlers of a run: the default registry's, plus the webhook's when it is on."""
    default = kopf.get_default_registry()
    if not config.webhook_port:
        return default
    combined = kopf.OperatorRegistry()
    for attr in _SUB_REGISTRIES:
        for source in (default, REGISTRY):
            for handler in getattr(source, attr).get_all_handlers():
                getattr(combined, attr).append(handler)
    return combined


@kopf.on.startup(registry=REGISTRY)
async def serve_webhook(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    config = context_of(memo).config
    settings.admission.server = GuardedWebhookServer(
        webhook_id=WEBHOOK_ID,
        client_ca_file=config.webhook_client_ca_file,
        addr=config.webhook_address,
        port=config.webhook_port,
        certfile=config.webhook_cert_file,
        pkeyfile=config.webhook_key_file,
    )


@kopf.on.mutate(
    "v1", "pods", id=WEBHOOK_ID, operations={"CREATE"}, ignore_failures=True, registry=REGISTRY
)
async def inject_worker(
    body: kopf.Body,
    patch: kopf.Patch,
    warnings: list[str],
    memo: Any,
    dryrun: bool,
    **_: Any,
) -> None:
    pod = dict(body)
    pipeline_name = inject.annotated_pipeline(pod)
    if pipeline_name is None or inject.already_injected(pod):
        return
    ctx = context_of(memo)
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    if ctx.config.namespaces and namespace not in ctx.config.namespaces:
        return  # another operator's (or nobody's) namespace: not ours to change
    where = f"annotation {names.INJECT_ANNOTATION}={pipeline_name}"
    pipeline_body = await ctx.api.get(PIPELINES, namespace, pipeline_name)
    # Decided before the Secret is read: a refused review costs one API read, the pipeline's.
    pipeline = _injectable(pipeline_body, namespace, ctx.config)
    secret = None
    if pipeline_body is not None and not isinstance(pipeline, str):
        try:
            secret = await read_kafka_secret(ctx.api, namespace, pipeline)
        except KafkaSecretError as exc:
            pipeline = f"its Kafka Secret: {exc}"
    if pipeline_body is None or isinstance(pipeline, str):
        # One answer whatever the namespace holds: without a client certificate demanded the
        # review may be a forgery from any pod, and the pipeline's status conditions tell the
        # why to those who may read the pipeline.
        log.info("not injecting %s/%s into a pod: %s", namespace, pipeline_name, pipeline)
        raise kopf.AdmissionError(
            f"{where}: no ConsumerPipeline {pipeline_name!r} with spec.mode: inject and a valid "
            f"spec in namespace {namespace!r} (kubectl get cpl {pipeline_name} -n {namespace} "
            f"-o yaml: its status conditions say why; or remove the annotation)",
            code=400,
        )
    try:
        injected, notes = inject.injected_pod(
            pod,
            pipeline_body,
            pipeline,
            ctx.config,
            kafka_mounts=None if secret is None else secret.mounts,
            kafka_config=None if secret is None else secret.plain,
        )
    except inject.InjectionError as exc:
        raise kopf.AdmissionError(f"{where}: {exc}", code=400) from exc
    warnings.extend(notes)
    for key in ("metadata", "spec"):
        patch[key] = _changed(pod.get(key) or {}, injected[key])
    if not dryrun:
        log.info("injected the worker of %s/%s into a pod", namespace, pipeline_name)


def _injectable(
    body: Mapping[str, Any] | None, namespace: str, config: OperatorConfig
) -> PipelineSpec | str:
    """The pipeline ``body`` if its worker can be injected, or why not (for the operator's
    log): missing, invalid (the reconcile's verdict), or not ``mode: inject``."""
    if body is None:
        return "no such pipeline"
    try:
        pipeline = validate(body)[0]  # the same verdict as the reconcile's
        group_ids.check(namespace, pipeline, config.confine_group_ids)
    except ConfigError as exc:
        return f"invalid: {exc}"
    if pipeline.mode != "inject":
        return f"spec.mode is {pipeline.mode}, not inject"
    return pipeline


def _changed(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The top-level keys of ``new`` that differ from ``old`` (kopf merges them as a patch)."""
    return {k: v for k, v in new.items() if old.get(k) != v}
