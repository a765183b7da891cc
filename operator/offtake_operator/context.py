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
from .kubeapi import KubeApi, Resource
from .settings import OperatorConfig
from .status import Event

Key = tuple[str, str]  # (namespace, name)

#: How long a "does the cluster serve this CRD" answer is trusted.
CAPABILITY_TTL_SECONDS = 60.0


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


class OperatorContext:
    def __init__(self, config: OperatorConfig, kafka: KafkaGateway | None = None) -> None:
        self.config = config
        self.kafka: KafkaGateway = kafka or AdminKafkaGateway(config.kafka_timeout_seconds)
        self.api = KubeApi()
        self.states: dict[Key, PipelineState] = {}
        #: Taken by each reconcile pass and lag status write (OperatorConfig.api_concurrency).
        self.api_slots = asyncio.Semaphore(config.api_concurrency)
        #: (plural, namespace, name) -> resourceVersion of each child as last written or read.
        self.written: dict[tuple[str, str, str], str] = {}
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
        for key in [k for k in self.written if k[1] == namespace and k[2] in children]:
            self.written.pop(key, None)

    def note_written(self, res: Resource, obj: Mapping[str, Any]) -> None:
        """Remember the resourceVersion of a child as this operator last left it."""
        meta = obj.get("metadata") or {}
        if meta.get("resourceVersion"):
            key = (res.plural, str(meta.get("namespace")), str(meta.get("name")))
            self.written[key] = str(meta["resourceVersion"])

    def wrote(self, plural: str, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj`` is exactly the version this operator last wrote or read back (its
        watch event is an echo of our own write, not news)."""
        meta = obj.get("metadata") or {}
        key = (plural, str(meta.get("namespace")), str(meta.get("name")))
        version = meta.get("resourceVersion")
        return version is not None and self.written.get(key) == str(version)

    async def serves(self, res: Resource) -> bool:
        """Whether an optional API (ServiceMonitor, KEDA) exists, cached for a minute."""
        now = time.monotonic()
        cached = self._capabilities.get(res)
        if cached is not None and cached[1] > now:
            return cached[0]
        found = await self.api.serves(res)
        self._capabilities[res] = (found, now + CAPABILITY_TTL_SECONDS)
        return found


MEMO_KEY = "offtake"


def context_of(memo: Any) -> OperatorContext:
    """The shared context in kopf's memo, created from the environment on first use."""
    ctx = memo.get(MEMO_KEY) if hasattr(memo, "get") else None
    if ctx is None:
        ctx = OperatorContext(OperatorConfig.from_env())
        memo[MEMO_KEY] = ctx
    assert isinstance(ctx, OperatorContext)
    return ctx
