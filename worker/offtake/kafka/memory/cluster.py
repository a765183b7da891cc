"""The shared state of one memory broker, and the one lock that guards it.

Owns the broker-wide lock: a :class:`threading.Condition` that guards the topics
(:class:`~.storage.TopicStore`), the groups (:class:`~.coordinator.GroupCoordinator`), the
injected faults (:class:`~.faults.FaultInjector`) and every client's own state, and that
wakes waiting consumers and producers on every change. Threading rule: every method named
``*_locked`` here, and every method of the parts above, runs with ``cond`` held; no
application callback ever runs with it held (clients release it first).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import KafkaError
from confluent_kafka.admin._metadata import (
    BrokerMetadata,
    ClusterMetadata,
    PartitionMetadata,
    TopicMetadata,
)

from .coordinator import GroupCoordinator
from .errors import kafka_error
from .faults import FaultInjector
from .messages import Entry
from .share_groups import ShareGroups
from .storage import TopicStore


class Cluster:
    """Topics, groups and faults behind one condition; see the module docstring."""

    def __init__(self, *, auto_create_topics: bool, default_partitions: int) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.auto_create = auto_create_topics
        self.default_partitions = default_partitions
        self.store = TopicStore()
        self.groups = GroupCoordinator(self.cond, self.store)
        self.faults = FaultInjector(self.cond, self.store)
        self.shares = ShareGroups(self.store)

    def create_topic_locked(self, name: str, partitions: int) -> None:
        self.store.create(name, partitions)
        self.groups.topology_changed(name)

    def grow_topic_locked(self, name: str, total: int) -> None:
        self.store.grow(name, total)
        self.groups.topology_changed(name)

    def append_locked(self, topic: str, partition: int, entry: Entry) -> int:
        offset = self.store.append(topic, partition, entry)
        self.cond.notify_all()
        return offset

    def tick_locked(self) -> None:
        """Advance time-based state: finish stalled deliveries, expel stuck members."""
        now = time.monotonic()
        self.faults.tick(now)
        self.groups.expire(now)
        self.shares.expire(now)

    def metadata(self, only: str | None) -> Any:
        """``list_topics()``: one broker, every topic (or just ``only``) with its partitions."""
        md: Any = ClusterMetadata()
        md.cluster_id = "memory"
        md.controller_id = 0
        b: Any = BrokerMetadata()
        b.id, b.host, b.port = 0, "memory", 9092
        md.brokers = {0: b}
        with self.cond:
            names = [only] if only is not None else self.store.names()
            for name in names:
                t: Any = TopicMetadata()
                t.topic = name
                parts = self.store.get(name)
                if parts is None:
                    t.error = kafka_error(
                        KafkaError.UNKNOWN_TOPIC_OR_PART,
                        f"Broker: Unknown topic or partition: {name}",
                    )
                    parts = []
                for i in range(len(parts)):
                    pm: Any = PartitionMetadata()
                    pm.id, pm.leader, pm.replicas, pm.isrs = i, 0, [0], [0]
                    t.partitions[i] = pm
                md.topics[name] = t
        return md
