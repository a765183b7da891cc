"""When to pause and resume fetching: bounded in-flight work with hysteresis.

Pausing (not blocking) is what keeps the worker in its group: it goes on polling, so the
broker sees it alive, while no new records arrive. Resuming only below a low-water mark
avoids flapping between paused and resumed on every record.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from offtake.config.spec import LimitsSpec
from offtake.kafka.source import KafkaSource
from offtake.metrics import Metrics
from offtake.records import TopicPartition

log = logging.getLogger("offtake.worker")

LOW_WATER = 0.5  # resume once in-flight work fell below half of each bound


@dataclass
class Backpressure:
    limits: LimitsSpec
    engaged: bool = False

    def update(self, messages: int, nbytes: int) -> bool:
        """Return whether fetching should be paused, given the in-flight totals."""
        if self.engaged:
            if (
                messages <= self.limits.max_in_flight_messages * LOW_WATER
                and nbytes <= self.limits.max_in_flight_bytes * LOW_WATER
            ):
                self.engaged = False
        elif (
            messages >= self.limits.max_in_flight_messages
            or nbytes >= self.limits.max_in_flight_bytes
        ):
            self.engaged = True
        return self.engaged

    def capacity(self, messages: int) -> int:
        """How many more records may be fetched now without crossing the message bound."""
        return max(0, self.limits.max_in_flight_messages - messages)


class PartitionPauser:
    """Pauses every assigned partition while backpressure is engaged, resumes them after.

    Keeps the set of partitions it paused, so a partition assigned under backpressure is
    paused too and a revoked one is forgotten. Runs on the poll loop's thread.
    """

    def __init__(self, source: KafkaSource, metrics: Metrics) -> None:
        self.source = source
        self.metrics = metrics
        self.paused: set[TopicPartition] = set()

    def apply(
        self, assigned: set[TopicPartition], pause: bool, why: str = "", quiet: bool = False
    ) -> None:
        """Pause (or resume) ``assigned``; ``quiet`` for pauses that are not backpressure."""
        if pause:
            todo = assigned - self.paused
            if todo:
                self.source.pause(todo)
                self.paused |= todo
                if not quiet:
                    log.info("backpressure: paused %d partition(s)%s", len(todo), why)
        elif self.paused:
            todo = self.paused & assigned
            if todo:
                self.source.resume(todo)
                log.info("backpressure released: resumed %d partition(s)", len(todo))
            self.paused = set()
        self.paused &= assigned
        self.metrics.paused_partitions.set(len(self.paused))

    def forget(self, partitions: set[TopicPartition]) -> None:
        self.paused -= partitions
