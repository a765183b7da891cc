"""Parking: records waiting out a delay, and the partitions held behind them.

Plain bookkeeping, no thread and no I/O: the processing thread
(:mod:`offtake.engine.processing_stage`) is its only user. Two ideas:

- **Parked records.** A record whose processing failed retriably waits out its backoff here,
  and so does one whose processor raised :class:`offtake.Backpressure` ("slow down") for its
  ``retry_after``; :meth:`Parking.take_due` gives them back, earliest first, once due. The
  records behind a parked one go on meanwhile, unless its partition is held.
- **Held partitions.** With ``errors.ordering: strict``, and always for a slow-down, the
  parked record holds its partition: records of it that arrive meanwhile wait behind it
  (:meth:`Parking.hold_behind`, with their result if they were processed already), and go on,
  in order, once it is settled (:meth:`Parking.settled`, then :meth:`Parking.release`).
  Other partitions are not held. A hold belongs to one assignment (epoch) of its partition: a
  hold of an earlier one is dropped when a record of a later one asks.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from offtake.processing.base import Outcome
from offtake.records import Record, TopicPartition

# A record to process: the record, the epoch of its partition's assignment, its attempt number.
Attempt = tuple[Record, int, int]
# A record held behind a parked one, with its result if it was processed already.
Held = tuple[Record, int, int, Outcome | None]


@dataclass(slots=True)
class Hold:
    """A parked record that holds its partition, and the records waiting behind it in order."""

    offset: int  # the parked record's
    epoch: int
    behind: deque[Held] = field(default_factory=deque)


class Parking:
    def __init__(self) -> None:
        # (due (time.monotonic()), tiebreak, record, epoch, attempt): a heap, earliest first.
        self._parked: list[tuple[float, int, Record, int, int]] = []
        self._tiebreak = itertools.count()
        # Held partitions: a plain attribute, read by routing once per record; changed only here.
        self.holds: dict[TopicPartition, Hold] = {}
        self._settled: list[TopicPartition] = []  # holds whose parked record was settled

    # -- parked records -------------------------------------------------------------------
    def park(self, record: Record, epoch: int, attempt: int, due: float) -> None:
        """Park ``record`` until ``due`` (time.monotonic()); ``attempt`` is its next one."""
        heapq.heappush(self._parked, (due, next(self._tiebreak), record, epoch, attempt))

    def parked(self) -> int:
        return len(self._parked)

    def has_due(self, now: float) -> bool:
        return bool(self._parked) and self._parked[0][0] <= now

    def until_next_due(self, now: float) -> float | None:
        """Seconds until the earliest parked record is due (0 if it is); None if none is."""
        return max(0.0, self._parked[0][0] - now) if self._parked else None

    def take_due(self, now: float, limit: int) -> list[Attempt]:
        """Up to ``limit`` parked records that are due, earliest first."""
        out: list[Attempt] = []
        while self._parked and self._parked[0][0] <= now and len(out) < limit:
            _, _, record, epoch, attempt = heapq.heappop(self._parked)
            out.append((record, epoch, attempt))
        return out

    # -- held partitions ------------------------------------------------------------------
    def hold(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        """The parked record at ``offset`` holds ``tp`` (this assignment) until it settles."""
        self.holds[tp] = Hold(offset, epoch)

    def hold_of(self, tp: TopicPartition, epoch: int) -> Hold | None:
        """The hold on ``tp`` in this assignment, if any (a stale one is dropped)."""
        hold = self.holds.get(tp)
        if hold is not None and hold.epoch != epoch:
            del self.holds[tp]
            return None
        return hold

    def hold_behind(self, hold: Hold, held: Held) -> None:
        """A record of a held partition waits behind its parked record."""
        hold.behind.append(held)

    def settled(self, tp: TopicPartition) -> None:
        """The parked record holding ``tp`` is settled: its partition may go on."""
        self._settled.append(tp)

    def take_settled(self) -> list[TopicPartition]:
        """Partitions whose parked record settled since the last call, to :meth:`release`."""
        out, self._settled = self._settled, []
        return out

    def release(self, tp: TopicPartition) -> deque[Held]:
        """End the hold on ``tp``; the records that waited behind it, in order."""
        hold = self.holds.pop(tp, None)
        return hold.behind if hold is not None else deque()

    def held_again(self, tp: TopicPartition, rest: deque[Held]) -> bool:
        """While releasing ``tp``: if a record of it holds it anew, ``rest`` waits behind that
        one (True); else False and the caller goes on with ``rest``."""
        hold = self.holds.get(tp)
        if hold is None:
            return False
        hold.behind.extend(rest)
        return True

    def forget(self, partitions: Collection[TopicPartition]) -> None:
        """Drop the holds of partitions no longer ours (their parked records go stale)."""
        for tp in partitions:
            self.holds.pop(tp, None)
