"""The one channel through which finished work reaches the poll loop.

Sinks, the dead-letter queue and the processing thread report from their own threads; only
the poll loop touches the offset tracker, so every report goes through this queue and the
loop applies them in order. A deque's append and popleft are atomic, so no lock is needed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from offtake.records import TopicPartition

Outcome = Literal["delivered", "dropped", "dlq", "skipped", "failed"]


@dataclass(frozen=True, slots=True)
class Completion:
    tp: TopicPartition
    offset: int
    epoch: int
    outcome: Outcome


class Completions:
    def __init__(self) -> None:
        self._queue: deque[Completion] = deque()

    def put(self, tp: TopicPartition, offset: int, epoch: int, outcome: Outcome) -> None:
        self._queue.append(Completion(tp, offset, epoch, outcome))

    def take_all(self) -> list[Completion]:
        out: list[Completion] = []
        while self._queue:
            out.append(self._queue.popleft())
        return out
