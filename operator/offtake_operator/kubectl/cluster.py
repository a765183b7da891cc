"""The API server as the user's kubeconfig reaches it: pipelines, their pods, Events, Secrets.

kubectl's rules for which cluster and namespace: ``--kubeconfig``, else $KUBECONFIG (a list
of files), else ~/.kube/config; ``--context``, else the current context; ``-n``, else the
context's namespace, else ``default``. Every failure becomes a :class:`PluginError` that says
what to do, never the client's traceback.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import kubernetes.client
import kubernetes.config
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from .. import names
from .errors import NoClusterError, NoCrdError, NotFoundError, PluginError
from .logs import worker_container

JSON = dict[str, Any]
T = TypeVar("T")
#: Seconds per API request: a cluster that does not answer is reported, not waited for.
REQUEST_TIMEOUT = 10.0
# The client's models and loaders are partly untyped: used through Any, their results are
# turned into plain JSON (:meth:`Cluster.plain`) before anything reads them.
client: Any = kubernetes.client
config: Any = kubernetes.config
CRD = f"{names.PLURAL}.{names.GROUP}/{names.VERSION}"


@dataclass(frozen=True)
class Target:
    kubeconfig: str | None
    context: str | None
    namespace: str | None


class Cluster:
    def __init__(self, target: Target) -> None:
        # $KUBECONFIG read now, not when the client was imported (it reads it at import).
        files = target.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        try:
            configuration = client.Configuration()
            config.load_kube_config(
                config_file=files,
                context=target.context,
                client_configuration=configuration,
            )
            contexts, current = config.list_kube_config_contexts(config_file=files)
        except (ConfigException, OSError, yaml.YAMLError) as exc:  # YAMLError: not a kubeconfig
            raise NoClusterError(
                f"no cluster configured ({exc}): set KUBECONFIG, or pass --kubeconfig/--context"
            ) from None
        # One attempt: a cluster that is down is said so at once, not after urllib3's retries.
        configuration.retries = 0
        self.server = configuration.host
        chosen = next((c for c in contexts if c["name"] == target.context), current)
        context_ns = ((chosen or {}).get("context") or {}).get("namespace")
        self.namespace: str = target.namespace or context_ns or "default"
        api = client.ApiClient(configuration)
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.policy = client.PolicyV1Api(api)
        self.autoscaling = client.AutoscalingV2Api(api)
        self.networking = client.NetworkingV1Api(api)

    def plain(self, model: Any) -> Any:
        """A client model as the API server's JSON (camelCase keys, RFC 3339 times)."""
        return self.api.sanitize_for_serialization(model)

    def _call(self, what: str, call: Callable[[], T], crd: str | None = None) -> T:
        try:
            return call()
        except ApiException as exc:
            raise self._api_error(exc, what, crd) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise NoClusterError(
                f"cannot reach the cluster at {self.server} ({type(exc).__name__}): check the "
                "kubeconfig's context, the VPN, or that the cluster runs"
            ) from None

    def _api_error(self, exc: ApiException, what: str, crd: str | None) -> PluginError:
        try:
            body = json.loads(exc.body or "")
        except (ValueError, TypeError):
            body = None
        if exc.status == 404 and isinstance(body, dict) and (body.get("details") or {}).get("name"):
            return NotFoundError(f"{what} not found in namespace {self.namespace}")
        if exc.status == 404 and crd is not None:
            # The API server answers a resource it does not serve with a plain "404 page not found".
            return NoCrdError(
                f"the cluster does not serve {crd} (is the Offtake CRD installed? "
                "helm install offtake helm/offtake, or kubectl apply -f crds/)"
            )
        message = body.get("message") if isinstance(body, dict) else None
        if exc.status in (401, 403):
            return PluginError(f"not allowed: {message or exc.reason}")
        return PluginError(f"{what}: {message or exc.reason} (HTTP {exc.status})")

    def get_custom(self, group: str, version: str, plural: str, name: str) -> JSON:
        """One object of a custom resource (any: the CRD check is the same for all)."""
        return dict(
            self._call(
                f"{plural}.{group} {name!r}",
                lambda: self.custom.get_namespaced_custom_object(
                    group, version, self.namespace, plural, name, _request_timeout=REQUEST_TIMEOUT
                ),
                crd=f"{plural}.{group}/{version}",
            )
        )

    def _on_pipeline(self, name: str, call: Callable[[], Any]) -> JSON:
        """A call about pipeline ``name``, its absence said the same way by every command."""
        try:
            return dict(self._call(f"ConsumerPipeline {name!r}", call, crd=CRD))
        except NotFoundError:
            raise NotFoundError(
                f"no ConsumerPipeline {name!r} in namespace {self.namespace} "
                "(kubectl get cpl lists them; -n picks another namespace)"
            ) from None

    def pipeline(self, name: str) -> JSON:
        return self._on_pipeline(
            name,
            lambda: self.custom.get_namespaced_custom_object(
                names.GROUP,
                names.VERSION,
                self.namespace,
                names.PLURAL,
                name,
                _request_timeout=REQUEST_TIMEOUT,
            ),
        )

    def pipelines(self) -> list[JSON]:
        listed = self._call(
            "ConsumerPipelines",
            lambda: self.custom.list_namespaced_custom_object(
                names.GROUP,
                names.VERSION,
                self.namespace,
                names.PLURAL,
                _request_timeout=REQUEST_TIMEOUT,
            ),
            crd=CRD,
        )
        return sorted(listed.get("items") or [], key=lambda p: p["metadata"]["name"])

    def patch_pipeline(self, name: str, body: JSON) -> JSON:
        """A merge patch of the pipeline (RBAC, admission, GitOps drift and audit all see it)."""
        return self._on_pipeline(
            name,
            lambda: self.custom.patch_namespaced_custom_object(
                names.GROUP,
                names.VERSION,
                self.namespace,
                names.PLURAL,
                name,
                body,
                _request_timeout=REQUEST_TIMEOUT,
            ),
        )

    def scale_pipeline(self, name: str, replicas: int) -> None:
        """Through the scale subresource, as ``kubectl scale cpl`` (its own RBAC verb)."""
        self._on_pipeline(
            name,
            lambda: self.custom.patch_namespaced_custom_object_scale(
                names.GROUP,
                names.VERSION,
                self.namespace,
                names.PLURAL,
                name,
                {"spec": {"replicas": replicas}},
                _request_timeout=REQUEST_TIMEOUT,
            ),
        )

    def pods(self, pipeline: str) -> list[JSON]:
        listed = self._call(
            "pods",
            lambda: self.core.list_namespaced_pod(
                self.namespace,
                label_selector=f"{names.PIPELINE_LABEL}={pipeline}",
                _request_timeout=REQUEST_TIMEOUT,
            ),
        )
        pods: list[JSON] = [self.plain(p) for p in listed.items]
        return sorted(pods, key=lambda p: str(p["metadata"]["name"]))

    def template_checksum(self, pipeline: str) -> str | None:
        """The config checksum the pipeline's Deployment wants its pods to carry."""
        try:
            deployment = self._call(
                "Deployment",
                lambda: self.apps.read_namespaced_deployment(
                    names.deployment_name(pipeline),
                    self.namespace,
                    _request_timeout=REQUEST_TIMEOUT,
                ),
            )
        except NotFoundError:
            return None
        template = self.plain(deployment)["spec"]["template"]
        value = ((template.get("metadata") or {}).get("annotations") or {}).get(
            names.CHECKSUM_ANNOTATION
        )
        return None if value is None else str(value)

    def events(self, pipeline: str, limit: int) -> list[JSON]:
        """The pipeline's last Events, oldest first."""
        listed = self._call(
            "events",
            lambda: self.core.list_namespaced_event(
                self.namespace,
                field_selector=f"involvedObject.name={pipeline},involvedObject.kind={names.KIND}",
                _request_timeout=REQUEST_TIMEOUT,
            ),
        )
        out: list[JSON] = []
        for e in listed.items:
            when = e.last_timestamp or e.event_time or e.metadata.creation_timestamp
            out.append(
                {
                    "time": when.strftime("%Y-%m-%dT%H:%M:%SZ") if when else "",
                    "type": e.type,
                    "reason": e.reason,
                    "message": e.message,
                    "count": e.count or 1,
                }
            )
        return sorted(out, key=lambda e: str(e["time"]))[-limit:]

    def secret_data(self, name: str, field: str) -> dict[str, str]:
        """A Secret's decoded data (only for the pipeline's own Kafka credentials)."""
        try:
            secret = self._call(
                f"Secret {name!r}",
                lambda: self.core.read_namespaced_secret(
                    name, self.namespace, _request_timeout=REQUEST_TIMEOUT
                ),
            )
        except NotFoundError:
            raise PluginError(f"{field}: Secret {self.namespace}/{name} not found") from None
        data: dict[str, str] = {}
        for key, value in (secret.data or {}).items():
            try:
                data[key] = base64.b64decode(value).decode().strip()
            except (binascii.Error, UnicodeDecodeError):
                data[key] = ""  # binary keystores: librdkafka reads the PEM keys instead
        return data

    def worker_log(self, pod: JSON, tail: int | None, since: int | None) -> str:
        """The worker container's log (the API server asks the pod's kubelet for it)."""
        name = pod["metadata"]["name"]
        if not (pod.get("spec") or {}).get("nodeName"):
            # The API server answers such a pod's log with nothing at all: say why instead.
            raise PluginError(f"pod {name!r} is on no node yet: no log")
        return self._pod_log(name, worker_container(pod), tail, since)

    def _pod_log(self, pod: str, container: str, tail: int | None, since: int | None) -> str:
        text = self._call(
            f"the log of pod {pod!r}",
            lambda: self.core.read_namespaced_pod_log(
                pod,
                self.namespace,
                container=container,
                tail_lines=tail,
                since_seconds=since,
                _request_timeout=REQUEST_TIMEOUT,
            ),
        )
        return str(text or "")

    def pod_proxy_get(self, pod: str, port: int, path: str) -> str:
        """GET ``path`` of ``pod``'s ``port`` through the API server's pod proxy: what reaches
        a pod's own port from a laptop outside the cluster network (RBAC: pods/proxy)."""
        response = self._call(
            f"{path} of pod {pod!r}",
            lambda: self.core.connect_get_namespaced_pod_proxy_with_path(
                f"{pod}:{port}",
                self.namespace,
                path.lstrip("/"),
                _request_timeout=REQUEST_TIMEOUT,
                _preload_content=False,
            ),
        )
        return bytes(response.data).decode("utf-8", "replace")

    def children(self, pipeline: str) -> dict[str, list[JSON] | str]:
        """The objects the operator made for ``pipeline``, by kind (an error text where the
        user may not list a kind, or the cluster does not serve it)."""
        workers = f"{names.PIPELINE_LABEL}={pipeline}"
        redrive = f"{names.REDRIVE_LABEL}={pipeline}"
        ns, t = self.namespace, REQUEST_TIMEOUT
        listings: dict[str, Callable[[], Any]] = {
            "Deployment": lambda: self.apps.list_namespaced_deployment(
                ns, label_selector=workers, _request_timeout=t
            ),
            "ConfigMap": lambda: self.core.list_namespaced_config_map(
                ns, label_selector=workers, _request_timeout=t
            ),
            "Service": lambda: self.core.list_namespaced_service(
                ns, label_selector=workers, _request_timeout=t
            ),
            "Job": lambda: self.batch.list_namespaced_job(
                ns, label_selector=workers, _request_timeout=t
            ),
            "RedriveJob": lambda: self.batch.list_namespaced_job(
                ns, label_selector=redrive, _request_timeout=t
            ),
            "PodDisruptionBudget": lambda: self.policy.list_namespaced_pod_disruption_budget(
                ns, label_selector=workers, _request_timeout=t
            ),
            "HorizontalPodAutoscaler": lambda: (
                self.autoscaling.list_namespaced_horizontal_pod_autoscaler(
                    ns, label_selector=workers, _request_timeout=t
                )
            ),
            "NetworkPolicy": lambda: self.networking.list_namespaced_network_policy(
                ns, label_selector=workers, _request_timeout=t
            ),
        }
        out: dict[str, list[JSON] | str] = {}
        for kind, listing in listings.items():
            try:
                items = self._call(kind, listing).items
            except PluginError as exc:
                out[kind] = str(exc)
                continue
            out[kind] = [self.plain(i) for i in items]
        return out
