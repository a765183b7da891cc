"""What the handlers share: settings, the API client, Kafka access and per-pipeline state."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import names
from .kafka_gateway import AdminKafkaGateway, KafkaGateway
from .kubeapi import CONFIGMAPS, DEPLOYMENTS, JOBS, JSON, PDBS, SERVICES, KubeApi, Resource
from .settings import OperatorConfig
from .status import Event

Key = tuple[str, str]  # (namespace, name)

#: How long a "does the cluster serve this CRD" answer is trusted: "yes" for a minute (a CRD
#: is rarely removed), "no" for a few seconds, so a CRD installed after the operator (the Spark
#: operator, KEDA) is used within seconds: its API group is served a moment after the CRD is
#: Established, and a "no" read in that moment must not hold a pipeline back for a minute.
CAPABILITY_TTL_SECONDS = 60.0
ABSENT_CAPABILITY_TTL_SECONDS = 3.0

#: How long a pipeline's passes take its watched children (WATCHED_CHILDREN, below) from
#: the cache the watch keeps up to date; then one pass reads them from the API server again.
#: The watch sends every change, but a child deleted while kopf's watch was listing again (after
#: an expired resourceVersion) sends none: that drift is repaired within this time.
CHILDREN_REREAD_SECONDS = 300.0

ChildKey = tuple[str, str, str]  # (plural, namespace, name)

#: The children the operator watches (server-side filtered by the pipeline label): a change to
#: one triggers a pass at once, and :attr:`OperatorContext.children` holds them. The others (an
#: autoscaler, a ServiceMonitor, ...) are read by every pass that needs them.
WATCHED_CHILDREN = (
    DEPLOYMENTS,
    CONFIGMAPS,
    SERVICES,
    PDBS,
    JOBS,  # spec.redrive's Job: its completion is the redrive's next step
)
#: The watched children whose status a pass reads: the Deployment's counts make the pipeline's
#: status, the Job's completion is the redrive's next step. A new version of another child that
#: differs from the known one only in its status (a PodDisruptionBudget's, which the disruption
#: controller rewrites as pods come and go) is no news.
STATUS_READ = (DEPLOYMENTS, JOBS)


@dataclass
class PipelineState:
    """In-memory bookkeeping for one ConsumerPipeline (lost on restart, which is fine)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: A reconcile is waiting for the lock: further triggers can be dropped, it will see them.
    queued: bool = False
    last_reconcile: float = float("-inf")
    last_lag: float = float("-inf")
    #: The last lag error logged, so a broker that stays down is logged once, not every tick.
    lag_error: str | None = None
    #: A spec (its JSON) and its validation (the result or its ConfigError): every pass and
    #: lag tick needs it, the spec changes far less often.
    validated: tuple[str, Any] | None = None
    #: When a pass last read the children from the API server rather than from
    #: :attr:`OperatorContext.children` (see CHILDREN_REREAD_SECONDS).
    children_read: float = float("-inf")

    def children_trusted(self, now: float) -> bool:
        """Whether this pass may take the watched children from the cache; if not, the pass
        reads them from the API server and the cache is trusted again from ``now``."""
        if now - self.children_read < CHILDREN_REREAD_SECONDS:
            return True
        self.children_read = now
        return False


class OperatorContext:
    def __init__(self, config: OperatorConfig, kafka: KafkaGateway | None = None) -> None:
        self.config = config
        self.kafka: KafkaGateway = kafka or AdminKafkaGateway(config.kafka_timeout_seconds)
        self.api = KubeApi()
        self.states: dict[Key, PipelineState] = {}
        #: Taken by each reconcile pass and lag status write (OperatorConfig.api_concurrency).
        self.api_slots = asyncio.Semaphore(config.api_concurrency)
        #: Each child as this operator last saw it: returned by its own write or read, or sent
        #: by the watch of children (managedFields left out). Passes read the children here
        #: instead of asking the API server each time; a watch event of a version known here
        #: is an echo, not news.
        self.children: dict[ChildKey, JSON] = {}
        self._capabilities: dict[Resource, tuple[bool, float]] = {}
        #: The last Events posted, newest last (for logs and tests; the API has them all).
        self.recent_events: deque[tuple[Key, Event]] = deque(maxlen=1000)
        #: Set at shutdown: daemons that outlive kopf's cleanup must not start new work.
        self.closed = False

    def state(self, namespace: str, name: str) -> PipelineState:
        key = (namespace, name)
        if key not in self.states:
            self.states[key] = PipelineState()
        return self.states[key]

    def forget(self, namespace: str, name: str) -> None:
        self.states.pop((namespace, name), None)
        children = {
            names.deployment_name(name),
            names.configmap_name(name),
            names.service_name(name),
            names.pdb_name(name),
            names.autoscaler_name(name),
            names.redrive_job_name(name),
        }
        for key in [k for k in self.children if k[1] == namespace and k[2] in children]:
            self.children.pop(key, None)

    def note_child(self, res: Resource, obj: Mapping[str, Any]) -> None:
        """Remember a child as the API server returned it or the watch sent it (only the watched
        ones: nothing would tell the others' changes)."""
        meta = obj.get("metadata") or {}
        if res in WATCHED_CHILDREN and meta.get("resourceVersion"):
            # managedFields: the largest part of most objects, and nothing a pass reads.
            slim = {k: v for k, v in meta.items() if k != "managedFields"}
            key = (res.plural, str(meta.get("namespace")), str(meta.get("name")))
            self.children[key] = {**obj, "metadata": slim}

    def drop_child(self, res: Resource, namespace: str, name: str) -> None:
        self.children.pop((res.plural, namespace, name), None)

    def child(self, res: Resource, namespace: str, name: str) -> JSON | None:
        """The child as last seen (None: not known, which is not the same as not existing)."""
        return self.children.get((res.plural, namespace, name))

    def knows(self, res: Resource, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj`` is the version of the child known here (its watch event is an echo of
        this operator's own write or read, or repeats what the watch sent), or differs from it
        only in a status no pass reads (STATUS_READ): no news."""
        meta = obj.get("metadata") or {}
        version = meta.get("resourceVersion")
        known = self.child(res, str(meta.get("namespace")), str(meta.get("name")))
        if version is None or known is None:
            return False
        if str(known["metadata"].get("resourceVersion")) == str(version):
            return True
        return res not in STATUS_READ and _beside_status(known) == _beside_status(obj)

    async def serves(self, res: Resource) -> bool:
        """Whether an optional API (ServiceMonitor, KEDA) exists, cached as the TTLs above say."""
        now = time.monotonic()
        cached = self._capabilities.get(res)
        if cached is not None and cached[1] > now:
            return cached[0]
        found = await self.api.serves(res)
        ttl = CAPABILITY_TTL_SECONDS if found else ABSENT_CAPABILITY_TTL_SECONDS
        self._capabilities[res] = (found, now + ttl)
        return found


def _beside_status(obj: Mapping[str, Any]) -> tuple[JSON, JSON]:
    """An object's metadata and content without its status and what every write changes."""
    meta = {
        k: v
        for k, v in (obj.get("metadata") or {}).items()
        if k not in ("resourceVersion", "managedFields")
    }
    return meta, {k: v for k, v in obj.items() if k not in ("metadata", "status")}


MEMO_KEY = "offtake"


def context_of(memo: Any) -> OperatorContext:
    """The shared context in kopf's memo, created from the environment on first use."""
    ctx = memo.get(MEMO_KEY) if hasattr(memo, "get") else None
    if ctx is None:
        ctx = OperatorContext(OperatorConfig.from_env())
        memo[MEMO_KEY] = ctx
    assert isinstance(ctx, OperatorContext)
    return ctx
