"""The scheduler: which record runs next when many calls may be in flight (processor.concurrency).

Plain bookkeeping, no thread and no I/O: the processing thread
(:mod:`offtake.engine.processing_stage`) is its only user, and it is unit-tested alone.

A record belongs to a **lane**, chosen by ``processor.order``:

- ``key``: its partition's assignment (topic, partition, epoch) and its key, bytes equal (a
  null key is one lane of its partition);
- ``partition``: its partition's assignment;
- ``none``: no lane: nothing waits for anything.

The rules it keeps:

- A lane is **busy** from the moment a record of it is handed out (:meth:`Scheduler.take`)
  until the stage says the record is done with (:meth:`Scheduler.done`): sent to the sink,
  dropped, or given to the error policy. A record parked for a retry's backoff or by
  ``offtake.Backpressure`` is not done: its lane stays busy while it waits, and it comes back
  through :meth:`resume`. So a lane is what a retry, a slow-down or strict ordering holds, and
  only the lane: records of other lanes flow past it.
- At most one record of a lane is ready or in flight; the others wait behind it in offset
  order (arrival order is offset order per partition) and become ready one at a time. So
  records of one lane never overlap and reach the sink in offset order, and a chunk of ready
  records (:meth:`take` with a limit above 1) never holds two records of one lane.
- At most ``limit`` records are in flight; :meth:`take` hands out nothing past it.
- A lane's state is dropped as soon as it is empty and idle: memory follows the records held,
  not the keys ever seen.
- :meth:`forget` drops the lanes and ready records of revoked partitions; records of them still
  in flight finish into nothing (their lanes are gone, and the stage drops stale results).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from typing import Literal

from offtake.engine.parking import Attempt
from offtake.records import TopicPartition

Order = Literal["key", "partition", "none"]
# A partition's assignment: its lanes belong to it, so a record of a later assignment never
# shares a lane with a stale one still in flight.
Assignment = tuple[str, int, int]  # topic, partition, epoch
_WHOLE = object()  # the one lane of a partition in partition order


class Scheduler:
    def __init__(self, order: Order, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.order = order
        self.limit = limit
        # Busy lanes by assignment, each with the records waiting behind it (offset order).
        self._lanes: dict[Assignment, dict[object, deque[Attempt]]] = {}
        self._ready: deque[Attempt] = deque()  # free to start, oldest first
        self.in_flight = 0
        self.waiting = 0  # records behind a busy lane

    def _lane(self, item: Attempt) -> object:
        return item[0].key if self.order == "key" else _WHOLE

    # -- records in -------------------------------------------------------------------------
    def add(self, item: Attempt) -> None:
        """A new record: ready if its lane is free, else it waits behind the lane."""
        if self.order == "none":
            self._ready.append(item)
            return
        record, epoch, _ = item
        lanes = self._lanes.setdefault((record.topic, record.partition, epoch), {})
        lane = self._lane(item)
        behind = lanes.get(lane)
        if behind is None:
            lanes[lane] = deque()  # busy from now on: this record is its head
            self._ready.append(item)
        else:
            behind.append(item)
            self.waiting += 1

    def resume(self, item: Attempt) -> None:
        """A parked record is due again: it is still its lane's head, so it is ready at once
        (first: it is older than anything that became ready meanwhile)."""
        self._ready.appendleft(item)

    # -- records out ------------------------------------------------------------------------
    def has_ready(self) -> bool:
        return bool(self._ready)

    def take(self, most: int = 1) -> list[Attempt]:
        """Up to ``most`` ready records to start now, within the in-flight limit."""
        n = min(most, self.limit - self.in_flight, len(self._ready))
        if n <= 0:
            return []
        ready = self._ready
        out = [ready.popleft() for _ in range(n)]
        self.in_flight += n
        return out

    def returned(self, n: int) -> None:
        """``n`` records handed out came back (their call finished); each is then :meth:`done`
        or parked (its lane stays busy), unless its partition was forgotten meanwhile."""
        self.in_flight -= n

    def done(self, item: Attempt) -> None:
        """A record is done with (to the sink, dropped, to the error policy): the next record
        of its lane, if any, becomes ready; an empty lane is dropped."""
        if self.order == "none":
            return
        record, epoch, _ = item
        assignment = (record.topic, record.partition, epoch)
        lanes = self._lanes.get(assignment)
        if lanes is None:
            return  # forgotten: its partition was revoked
        lane = self._lane(item)
        behind = lanes.get(lane)
        if behind is None:
            return
        if behind:
            self._ready.append(behind.popleft())
            self.waiting -= 1
        else:
            del lanes[lane]
            if not lanes:
                del self._lanes[assignment]

    def forget(self, partitions: Collection[TopicPartition]) -> None:
        """Drop everything of these partitions that has not started (their records are
        redelivered to whoever owns them next)."""
        gone = set(partitions)
        for assignment in [a for a in self._lanes if (a[0], a[1]) in gone]:
            self.waiting -= sum(len(b) for b in self._lanes.pop(assignment).values())
        if any(r.tp in gone for r, _, _ in self._ready):
            self._ready = deque(i for i in self._ready if i[0].tp not in gone)

    # -- for metrics and the stage's loop ---------------------------------------------------
    def idle(self) -> bool:
        """Nothing in flight, ready or waiting (parked records are the parking's to count)."""
        return not self.in_flight and not self._ready and not self.waiting

    def lanes(self) -> int:
        """Busy lanes (for tests: memory follows the records held)."""
        return sum(len(lanes) for lanes in self._lanes.values())
