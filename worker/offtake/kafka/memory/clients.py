"""The memory broker's client factory: one worker's consumers and producers.

Owns :class:`MemoryClients`, the :class:`~offtake.kafka.protocols.ClientFactory` a worker
under test gets, and the simulated SIGKILL of everything it made. Its lists are appended by
the worker's threads and read by the test harness; ``kill()`` is meant to run once, from the
harness.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import OFFSET_INVALID, TopicPartition

from .cluster import Cluster
from .consumer import MemoryConsumer
from .errors import ClientKilled
from .producer import MemoryProducer
from .share_consumer import MemoryShareConsumer


class MemoryClients:
    """The :class:`~offtake.kafka.protocols.ClientFactory` of one worker on a memory broker."""

    def __init__(self, cluster: Cluster, name: str = "") -> None:
        self._cluster = cluster
        self.name = name
        self.consumers: list[MemoryConsumer] = []
        self.producers: list[MemoryProducer] = []
        self.share_consumers: list[MemoryShareConsumer] = []
        self.killed = False

    def consumer(self, config: dict[str, Any]) -> MemoryConsumer:
        if self.killed:
            raise ClientKilled("this worker was killed by the test harness")
        conf = dict(config)
        if self.name and "client.id" not in conf:
            conf["client.id"] = self.name
        c = MemoryConsumer(self._cluster, conf)
        self.consumers.append(c)
        return c

    def producer(self, config: dict[str, Any]) -> MemoryProducer:
        if self.killed:
            raise ClientKilled("this worker was killed by the test harness")
        p = MemoryProducer(self._cluster, config)
        self.producers.append(p)
        return p

    def share_consumer(self, config: dict[str, Any]) -> MemoryShareConsumer:
        if self.killed:
            raise ClientKilled("this worker was killed by the test harness")
        c = MemoryShareConsumer(self._cluster, config)
        self.share_consumers.append(c)
        return c

    def configure_share_group(
        self, config: dict[str, Any], group: str, settings: dict[str, str]
    ) -> int | None:
        with self._cluster.cond:
            self._cluster.shares.configure(group, settings)
            return int(self._cluster.shares.group(group).config["share.record.lock.duration.ms"])

    def topic_partition(self, topic: str, partition: int, offset: int = OFFSET_INVALID) -> Any:
        return TopicPartition(topic, partition, offset)

    def kill(self) -> None:
        """Abandon every client made here as SIGKILL would: no revoke, commit, flush or leave.

        The broker removes the consumers from their groups at once (their partitions are
        lost, and the other members take them over without any revoke by this one), drops
        messages its producers had not written yet, and every later call on these clients
        raises :class:`ClientKilled`.
        """
        self.killed = True
        for c in self.consumers:
            c._kill()
        for p in self.producers:
            p._kill()
        for s in self.share_consumers:
            s._kill()
