"""The delivery mode contract: what happens to records once they are settled.

The poll loop (:class:`offtake.engine.worker.Worker`) consumes, hands records to the
processing thread, drains and shuts down; it never asks which delivery mode runs. Everything
that differs between modes is a :class:`DeliveryMode`. There are three, chosen in one
place, :func:`offtake.engine.assembly.make_delivery`, and handed in through ``WorkerParts``:

- :class:`~offtake.engine.delivery.at_least_once.AtLeastOnce`: consumer offset commits
  (:mod:`offtake.engine.commits`), batched while running, synchronous before letting go.
- :class:`~offtake.engine.delivery.transactional.Transactional`: exactly-once, the offsets
  committed inside the Kafka sink's transaction.
- :class:`~offtake.engine.delivery.queue.Queue`: queue mode (a share group), each record
  acknowledged on its own; no offsets, no rebalance callbacks.

What a mode owns, and the hooks through which the loop hands it each moment (all called on
the poll loop's thread, one at a time; a mode needs no lock for its own state):

- **The settled records.** Every settlement the processing thread reports (a record, or a run
  of one partition's records, delivered, dropped, dead-lettered, retried, skipped or failed:
  :mod:`offtake.engine.settlements`) goes to :meth:`DeliveryMode.settle`. The default marks
  it in the :class:`~offtake.engine.offsets.OffsetTracker`; a mode that acknowledges per
  record (queue mode: which acknowledgement for which settlement is :data:`.queue.ACKS`)
  records the acknowledgement here too. The loop itself
  counts the records for the ``processed`` metric and stops the worker on ``failed``.
- **The tracker.** :attr:`DeliveryMode.tracker` is the bookkeeping of records in flight,
  shared with the loop: the loop registers each poll's records (``register_batch``), reads the
  in-flight totals for the in-flight bound, and records assignments (``assign``,
  ``committed``, ``seed``) and releases from the source's listener. Records stay in flight
  until the mode reports them committed (``tracker.committed(tp, offset)``, which releases
  everything below ``offset``; queue mode: ``tracker.acknowledged(tp)``): the in-flight
  bound, and so the duplicates after a crash, is counted up to the mode's acknowledgement,
  not up to settlement.
- **Attempt numbers**: :attr:`DeliveryMode.first_attempt`, which the processing stage asks
  for a record's first attempt number (None: 1 for every record; queue mode: the broker's
  delivery count).
- **When it commits**: :meth:`step`, once per loop iteration, after the settlements.
- **The in-flight bound**: :meth:`at_bound`, when no more records may be fetched until some
  are released. True if it did something that frees room (a synchronous commit); False and
  the loop waits for the processing thread's progress instead.
- **Revoke**: :meth:`revoking`, before the source lets partitions go. It lets their work
  finish (:meth:`Loop.drain`), gives up what did not finish in time (:meth:`Loop.abandon`),
  and makes what was delivered durable, then says how that went (:class:`Released`); the
  loop logs it and releases the partitions from the tracker.
- **Lost partitions**: :meth:`lost`, after the loop abandoned and released them (another
  member may own them already: nothing of theirs may be committed).
- **Commit acknowledgements**: :meth:`on_commit`, the source's commit callback.
- **Shutdown**, in two steps: :meth:`end` once the loop's drain is over (the processing
  thread still runs, so a mode can use what it owns: ending a transaction), and
  :meth:`final_commit` after the processing thread stopped and its last settlements were
  applied. A mode without rebalance callbacks (share groups) simply never gets
  :meth:`revoking` or :meth:`lost`; its shutdown is :meth:`end` and :meth:`final_commit`.

A mode may call back into the loop only through :class:`Loop` (handed to :meth:`bind` by
the worker's constructor): drain, abandon, stop the worker, republish the assignment.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from offtake.engine.offsets import OffsetTracker
from offtake.engine.settlements import Settled, SettledMany
from offtake.kafka.protocols import MessageLike
from offtake.records import TopicPartition


class Loop(Protocol):
    """What a delivery mode may ask of the poll loop, on the loop's thread."""

    def drain(self, partitions: set[TopicPartition] | None, deadline: float) -> bool:
        """Let in-flight work of ``partitions`` (all when None) settle, until ``deadline``
        (time.monotonic()); applies the settlements (through :meth:`DeliveryMode.settle`)
        as they come. True once nothing of them is pending."""
        ...

    def abandon(self, partitions: set[TopicPartition]) -> None:
        """Drop the processing thread's and the sink's unfinished work of ``partitions``."""
        ...

    def fail(self, code: int, reason: str) -> None:
        """Stop the worker with exit ``code`` (:mod:`offtake.engine.exit_codes`), logging why."""
        ...

    def assignment_changed(self) -> None:
        """The tracker's epochs changed (re-``assign``ed partitions): tell the processing
        thread, so work of the old epochs is dropped as stale."""
        ...


@dataclass(frozen=True, slots=True)
class Released:
    """How letting go of partitions went, for the loop's log line."""

    drained: bool  # every record of them settled in time (else: redelivered by the next owner)
    committed: bool  # what was delivered here is durable (else: delivered again)


class DeliveryMode(ABC):
    """One delivery mode; see the module docstring for what it owns and when each hook runs."""

    def __init__(self, tracker: OffsetTracker) -> None:
        self.tracker = tracker
        self._loop: Loop | None = None

    @property
    def loop(self) -> Loop:
        assert self._loop is not None, "DeliveryMode.bind() was not called"
        return self._loop

    def bind(self, loop: Loop) -> None:
        """Called once by the worker's constructor, before anything else."""
        self._loop = loop

    @property
    def first_attempt(self) -> Callable[[MessageLike], int] | None:
        """A record's first attempt number, for the processing stage (see the module
        docstring); None: every record starts at 1, the stage's fast path."""
        return None

    @property
    def all_first_attempts(self) -> Callable[[list[MessageLike]], bool] | None:
        """Whether every one of a Work's records starts at attempt 1 although
        :attr:`first_attempt` numbers attempts (queue mode: none was delivered before), so the
        stage takes its fast path for them; None: no such check (see :attr:`first_attempt`)."""
        return None

    def settle(self, settled: Settled | SettledMany) -> int:
        """Apply one settlement; returns how many records it settled (0: a stale assignment's,
        or a failed record, which the loop stops the worker for)."""
        if isinstance(settled, SettledMany):
            ok = self.tracker.settle_many(settled.tp, settled.offsets, settled.epoch)
            return len(settled.offsets) if ok else 0
        if settled.how == "failed":
            self.tracker.fail(settled.tp, settled.offset, settled.epoch)
            return 0
        return 1 if self.tracker.settle(settled.tp, settled.offset, settled.epoch) else 0

    @abstractmethod
    def step(self, now: float) -> None:
        """Once per loop iteration (``now``: time.monotonic()): commit if it is time."""

    def at_bound(self, now: float) -> bool:
        """At the in-flight bound; True if something was done to free room (see module)."""
        return False

    @abstractmethod
    def revoking(self, partitions: set[TopicPartition], deadline: float) -> Released:
        """Before ``partitions`` are let go: drain until ``deadline``, abandon what did not
        finish, make what was delivered durable."""

    def lost(self, partitions: set[TopicPartition]) -> None:
        """``partitions`` were lost (already abandoned and released by the loop)."""

    def on_commit(self, offsets: dict[TopicPartition, int] | None, error: str | None) -> None:
        """The source's commit callback: a commit's acknowledged offsets, or its error."""

    @abstractmethod
    def end(self, drained: bool) -> None:
        """Shutdown, the loop's drain over (``drained``: nothing was left pending); the
        processing thread still runs."""

    @abstractmethod
    def final_commit(self, deadline: float) -> None:
        """Shutdown, the processing thread stopped: make what was delivered durable, until
        ``deadline`` (time.monotonic())."""
