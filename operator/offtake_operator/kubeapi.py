"""The operator's access to the API for the children it owns, on the official ``kubernetes``
client.

kopf talks to the API for the ConsumerPipeline objects themselves; this client creates and
patches the children (ConfigMap, Deployment, ...). There is one login: kopf's login handler
loads the credentials with the ``kubernetes`` client (in-cluster, else the kubeconfig; see
:mod:`offtake_operator.handlers`) and hands the same configuration to :meth:`KubeApi.use`.

Bodies are plain dicts, sent with ``ApiClient.call_api``: the operator renders them as such, and
the children span the core, apps, batch, policy and autoscaling groups plus optional CRDs
(Prometheus operator, KEDA, the Spark operator). The typed APIs would need a class per group and
model objects both ways, ``CustomObjectsApi`` cannot reach the core group, and ``DynamicClient``
adds discovery round trips and wraps every answer in ``ResourceInstance`` objects (CPU the
operator spends per pipeline per resync). Each method is one request, of the verbs the chart's
RBAC grants (docs/operator.md, "RBAC"): no discovery, no PUT.

The client is synchronous: each call runs in a bounded pool of threads (:data:`THREADS`, as many
as the connection pool keeps connections, so every thread reuses one), with a timeout per call.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kubernetes import config
from kubernetes.client import ApiClient, Configuration

from .errors import OperatorError
from .names import GROUP, KIND, PLURAL, VERSION

JSON = dict[str, Any]

#: The field manager of every child the operator applies (metadata.managedFields).
FIELD_MANAGER = "offtake"

#: Calls in flight at once, and connections kept open to the API server.
THREADS = 20


def load_configuration() -> Configuration:
    """The operator's credentials: its ServiceAccount's in a pod (the token re-read as the
    kubelet rotates it), else the kubeconfig's current context (exec plugins and token refresh
    included). $KUBECONFIG is read now: the client reads it once, when it is imported."""
    configuration = Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.environ.get("KUBECONFIG") or "~/.kube/config",
            client_configuration=configuration,
        )
    return configuration


@dataclass(frozen=True)
class Resource:
    """One kind of object in the API: where it lives and what it is called."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [base]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{namespace}")
        parts.append(self.plural)
        if name:
            parts.append(name)
            if sub:
                parts.append(sub)
        return "/".join(parts)

    def __str__(self) -> str:
        return f"{self.plural}.{self.version}.{self.group}" if self.group else f"{self.plural}.v1"


PIPELINES = Resource(GROUP, VERSION, PLURAL, KIND)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
SERVICES = Resource("", "v1", "services", "Service")
SECRETS = Resource("", "v1", "secrets", "Secret")
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
JOBS = Resource("batch", "v1", "jobs", "Job")
PDBS = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
HPAS = Resource("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler")
SERVICEMONITORS = Resource("monitoring.coreos.com", "v1", "servicemonitors", "ServiceMonitor")
PROMETHEUSRULES = Resource("monitoring.coreos.com", "v1", "prometheusrules", "PrometheusRule")
SCALEDOBJECTS = Resource("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject")
TRIGGERAUTHS = Resource("keda.sh", "v1alpha1", "triggerauthentications", "TriggerAuthentication")
# The Kubeflow Spark operator's Spark Connect server (sink.spark.submit.mode: kubernetes).
NETWORKPOLICIES = Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
SPARKCONNECTS = Resource("sparkoperator.k8s.io", "v1alpha1", "sparkconnects", "SparkConnect")
PODS = Resource("", "v1", "pods", "Pod")


@dataclass(frozen=True)
class Cause:
    """One of the API server's ``details.causes``: the field it refused and why."""

    field: str
    message: str
    #: The server's machine-readable reason (FieldValueDuplicate, FieldValueInvalid, ...).
    reason: str = ""


#: At most this many causes are kept, each field and message cut to CAUSE_TEXT_LIMIT: the
#: answer may come from an admission webhook, which can say anything at any length.
CAUSES_KEPT = 20
CAUSE_TEXT_LIMIT = 500

#: The start of the message server-side apply gives (as a 500) for a body it cannot type
#: against the kind's schema, such as two env entries of one name (kubernetes#121575).
TYPED_PATCH_REFUSED = "failed to create typed patch object"
#: The 500s of server-side apply that the body (or the object it applies to) causes, the same
#: on every try: TYPED_PATCH_REFUSED, an object that already holds such duplicates (made by a
#: create), a value its Go type cannot hold ("quantities must match the regular expression").
#: Seen on kube-apiserver 1.34.
APPLY_REFUSED = (
    TYPED_PATCH_REFUSED,
    "failed to create typed live object",
    "failed to convert new object",
)


class ApiError(OperatorError):
    """The API server answered with an error; the message names the request and the object."""

    def __init__(
        self,
        method: str,
        path: str,
        status: int,
        reason: str,
        message: str,
        causes: tuple[Cause, ...] = (),
    ) -> None:
        super().__init__(f"{method} {path}: {status} {reason}: {message}")
        self.method = method
        self.path = path
        self.status = status
        self.reason = reason
        self.message = message
        self.causes = causes

    @property
    def body_refused(self) -> bool:
        """Server-side apply could not make an object of the body (:data:`APPLY_REFUSED`). It
        answers that with a 500, but the body is at fault: the same body fails again."""
        return self.status == 500 and self.message.startswith(APPLY_REFUSED)

    @property
    def retriable(self) -> bool:
        """Worth another try later: conflicts, throttling, server-side and auth hiccups."""
        if self.body_refused:
            return False
        return self.status in (401, 409, 429) or self.status >= 500


def causes_of(payload: Any) -> tuple[Cause, ...]:
    """The ``details.causes`` of an error answer (a Status), bounded (:data:`CAUSES_KEPT`)."""
    details = payload.get("details") if isinstance(payload, dict) else None
    listed = details.get("causes") if isinstance(details, dict) else None
    if not isinstance(listed, list):
        return ()
    return tuple(
        Cause(
            field=str(c.get("field") or "")[:CAUSE_TEXT_LIMIT],
            message=str(c.get("message") or "")[:CAUSE_TEXT_LIMIT],
            reason=str(c.get("reason") or "")[:CAUSE_TEXT_LIMIT],
        )
        for c in listed[:CAUSES_KEPT]
        if isinstance(c, dict)
    )


class KubeApi:
    """Plain-dict CRUD against the API server with the login's configuration.

    :meth:`use` takes a new configuration at every (re-)login, for example after a rotated
    service-account token, so the next call uses it without rebuilding anything else.
    """

    def __init__(self, *, timeout: float = 30.0) -> None:
        self._timeout = timeout
        self._client: ApiClient | None = None
        self._executor = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="kubeapi")
        self._closed = False

    def use(self, configuration: Configuration) -> None:
        """Send every later call with ``configuration`` (credentials, server, TLS)."""
        configuration.connection_pool_maxsize = THREADS
        old, self._client = self._client, ApiClient(configuration)
        if old is not None:
            old.close()  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            self._client.close()  # type: ignore[no-untyped-call]
            self._client = None

    def _call(
        self,
        method: str,
        path: str,
        body: Any,
        params: Mapping[str, str] | None,
        content_type: str,
    ) -> JSON:
        client = self._client
        if client is None:
            raise RuntimeError("the operator has not logged in to the API server yet")
        # The body goes to call_api as it is: the renderings are plain JSON already, and the
        # client's own serialisation (for its model classes) would walk each one again.
        method, url, headers, _, _ = client.param_serialize(
            method,
            path,
            query_params=list((params or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        resp = client.call_api(method, url, headers, body, _request_timeout=self._timeout)
        text = resp.read().decode()  # type: ignore[no-untyped-call]
        if resp.status >= 400:
            reason, message = resp.reason or "", text
            causes: tuple[Cause, ...] = ()
            try:
                payload = json.loads(text)
                reason = payload.get("reason") or reason
                message = payload.get("message") or message
                causes = causes_of(payload)
            except (ValueError, AttributeError):  # not JSON, or JSON but not an object
                pass
            raise ApiError(
                method, path, resp.status, str(reason)[:200], str(message)[:2000], causes
            )
        if not text:
            return {}
        result = json.loads(text)
        return result if isinstance(result, dict) else {"items": result}

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JSON:
        if self._closed:
            raise ApiError(method, path, 0, "ClientClosed", "the operator is shutting down")
        call = functools.partial(self._call, method, path, body, params, content_type)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def get(self, res: Resource, namespace: str | None, name: str) -> JSON | None:
        """The object, or None if it does not exist."""
        try:
            return await self.request("GET", res.path(namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(
        self, res: Resource, namespace: str | None, *, label_selector: str | None = None
    ) -> list[JSON]:
        params = {"labelSelector": label_selector} if label_selector else None
        result = await self.request("GET", res.path(namespace), params=params)
        items = result.get("items") or []
        return [i for i in items if isinstance(i, dict)]

    async def create(self, res: Resource, namespace: str | None, body: Mapping[str, Any]) -> JSON:
        return await self.request("POST", res.path(namespace), body=body)

    async def patch(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any],
        *,
        subresource: str | None = None,
    ) -> JSON:
        """A JSON merge patch: maps merge, lists and scalars are replaced, null deletes."""
        return await self.request(
            "PATCH",
            res.path(namespace, name, subresource),
            body=patch,
            content_type="application/merge-patch+json",
        )

    async def apply(
        self, res: Resource, namespace: str | None, name: str, body: Mapping[str, Any]
    ) -> JSON:
        """Server-side apply ``body`` as Offtake's field manager, forcing conflicts: the object
        ends up with exactly the fields this manager applied last (a field dropped from
        ``body`` is removed), fields other managers own are left alone."""
        return await self.request(
            "PATCH",
            res.path(namespace, name),
            body=body,  # JSON is YAML
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            content_type="application/apply-patch+yaml",
        )

    async def delete(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        *,
        propagation: str | None = None,
        uid: str = "",
    ) -> bool:
        """Delete the object; False if it was already gone. ``propagation`` (Background,
        Foreground, Orphan): what happens to its dependents (a Job's pods are orphaned by
        default). ``uid``: delete only the object with this uid (a precondition the API server
        checks), False if the name now holds another one."""
        body: dict[str, Any] = {}
        if propagation is not None:
            body["propagationPolicy"] = propagation
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", res.path(namespace, name), body=body or None)
        except ApiError as exc:
            if exc.status == 404 or (uid and exc.status == 409):
                return False
            raise
        return True

    async def serves(self, res: Resource) -> bool:
        """Whether the cluster serves this resource (e.g. the ServiceMonitor CRD is installed)."""
        base = f"/apis/{res.group}/{res.version}" if res.group else f"/api/{res.version}"
        try:
            listing = await self.request("GET", base)
        except ApiError as exc:
            if exc.status in (404, 503):
                return False
            raise
        return any(r.get("name") == res.plural for r in listing.get("resources", []))
