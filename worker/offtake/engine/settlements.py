"""The one channel through which finished work reaches the poll loop.

The processing thread settles records (delivered, dropped, dead-lettered, sent to a retry
topic, skipped, failed); only the poll loop touches the offset tracker, so every settlement goes
through this queue and the loop applies them in order. A request to stop the worker
(``errors.policy: stop``, an internal error) travels the same way, so no other thread ever
calls into the worker. A deque's append and popleft are atomic, so no lock is needed.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from typing import Literal

from offtake.records import TopicPartition

Settlement = Literal["delivered", "dropped", "dlq", "retried", "skipped", "failed"]


@dataclass(frozen=True, slots=True)
class Settled:
    """One record is finished with; ``reason`` says why the worker must stop, for "failed"."""

    tp: TopicPartition
    offset: int
    epoch: int
    how: Settlement
    reason: str = ""


@dataclass(frozen=True, slots=True)
class SettledMany:
    """Records of one partition finished with the same way, at once (a sink batch)."""

    tp: TopicPartition
    offsets: list[int]
    epoch: int
    how: Settlement


class Settlements:
    def __init__(self) -> None:
        self._queue: deque[Settled | SettledMany] = deque()
        self._stops: deque[str] = deque()
        self._slow_downs: deque[tuple[TopicPartition, int, float]] = deque()
        # A mark that changes with every entry posted (settlements, slow-downs, stops): the
        # processing thread wakes the poll loop when it moved, and only then
        # (ProcessingStage._tell_posted). Each post writes a number of its own, drawn from a
        # counter (next() is atomic under the GIL), so two threads posting at once cannot
        # leave the mark where the reader last saw it, as ``posted += 1`` could.
        self._marks = itertools.count(1)
        self.posted = 0

    def put(
        self, tp: TopicPartition, offset: int, epoch: int, how: Settlement, reason: str = ""
    ) -> None:
        self._queue.append(Settled(tp, offset, epoch, how, reason))
        self.posted = next(self._marks)

    def put_many(self, tp: TopicPartition, offsets: list[int], epoch: int, how: Settlement) -> None:
        """Settle records of one partition together: one entry, not one per record."""
        self._queue.append(SettledMany(tp, offsets, epoch, how))
        self.posted = next(self._marks)

    def request_slow_down(self, tp: TopicPartition, epoch: int, until: float) -> None:
        """Ask the poll loop to pause ``tp`` until ``until`` (wall clock): offtake.Backpressure."""
        self._slow_downs.append((tp, epoch, until))
        self.posted = next(self._marks)

    def take_slow_downs(self) -> list[tuple[TopicPartition, int, float]]:
        out: list[tuple[TopicPartition, int, float]] = []
        while self._slow_downs:
            out.append(self._slow_downs.popleft())
        return out

    def request_stop(self, reason: str) -> None:
        """Ask the poll loop to stop the worker (exit code 1) for a reason it logs."""
        self._stops.append(reason)
        self.posted = next(self._marks)

    def waiting(self) -> bool:
        """Whether settlements wait to be taken (a look from any thread)."""
        return bool(self._queue)

    def take_all(self) -> list[Settled | SettledMany]:
        out: list[Settled | SettledMany] = []
        while self._queue:
            out.append(self._queue.popleft())
        return out

    def take_stop(self) -> str | None:
        return self._stops.popleft() if self._stops else None
