"""A small async Kubernetes API client for the children the operator owns.

kopf talks to the API for the ConsumerPipeline objects themselves; this client creates and
patches the children (ConfigMap, Deployment, ...) with the same credentials, which the login
handler hands over (see :mod:`offtake_operator.handlers`). Bodies are plain dicts: the operator
renders them as such, and the Kubernetes client's model classes would only get in the way.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf

from .names import GROUP, KIND, PLURAL, VERSION

JSON = dict[str, Any]

#: The field manager of every child the operator applies (metadata.managedFields).
FIELD_MANAGER = "offtake"


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


class ApiError(Exception):
    """The API server answered with an error; the message names the request and the object."""

    def __init__(self, method: str, path: str, status: int, reason: str, message: str) -> None:
        super().__init__(f"{method} {path}: {status} {reason}: {message}")
        self.method = method
        self.path = path
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def retriable(self) -> bool:
        """Worth another try later: conflicts, throttling, server-side and auth hiccups."""
        return self.status in (401, 409, 429) or self.status >= 500


class KubeApi:
    """Plain-dict CRUD against the API server with kopf's connection info.

    ``connection`` is a callable so that a re-login (for example, a rotated service-account
    token) takes effect on the next request without rebuilding the client.
    """

    def __init__(
        self, connection: Callable[[], kopf.ConnectionInfo], *, timeout: float = 30.0
    ) -> None:
        self._connection = connection
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._session_info: kopf.ConnectionInfo | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _get_session(self) -> tuple[aiohttp.ClientSession, kopf.ConnectionInfo]:
        if self._closed:
            raise ApiError("-", "-", 0, "ClientClosed", "the operator is shutting down")
        info = self._connection()
        async with self._lock:
            if self._session is None or self._session_info is not info or self._session.closed:
                if self._session is not None:
                    await self._session.close()
                connector = aiohttp.TCPConnector(ssl=info.as_ssl_context(), limit=20)
                self._session = aiohttp.ClientSession(
                    connector=connector, timeout=self._timeout, headers=info.as_http_headers()
                )
                self._session_info = info
            return self._session, info

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JSON:
        session, info = await self._get_session()
        url = info.server.rstrip("/") + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        async with session.request(method, url, data=data, headers=headers) as resp:
            text = await resp.text()
            if resp.status >= 400:
                reason, message = resp.reason or "", text
                try:
                    payload = json.loads(text)
                    reason = payload.get("reason") or reason
                    message = payload.get("message") or message
                except ValueError:
                    pass
                raise ApiError(method, path, resp.status, str(reason), str(message)[:2000])
            if not text:
                return {}
            result = json.loads(text)
            return result if isinstance(result, dict) else {"items": result}

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
