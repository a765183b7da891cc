"""The one channel through which finished work reaches the poll loop.

The processing thread settles records (delivered, dropped, dead-lettered, sent to a retry
topic, skipped, failed); only the poll loop touches the offset tracker, so every settlement goes
through this queue and the loop applies them in order. A request to stop the worker
(``errors.policy: stop``, an internal error) travels the same way, so no other thread ever
calls into the worker. A deque's append and popleft are atomic, so no lock is needed.
"""

from __future__ import annotations

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


class Completions:
    def __init__(self) -> None:
        self._queue: deque[Settled] = deque()
        self._stops: deque[str] = deque()

    def put(
        self, tp: TopicPartition, offset: int, epoch: int, how: Settlement, reason: str = ""
    ) -> None:
        self._queue.append(Settled(tp, offset, epoch, how, reason))

    def request_stop(self, reason: str) -> None:
        """Ask the poll loop to stop the worker (exit code 1) for a reason it logs."""
        self._stops.append(reason)

    def take_all(self) -> list[Settled]:
        out: list[Settled] = []
        while self._queue:
            out.append(self._queue.popleft())
        return out

    def take_stop(self) -> str | None:
        return self._stops.popleft() if self._stops else None
