"""The sink contract: where processed records go, and how a sink says they arrived.

A sink receives :class:`SinkItem` objects (one source record and the values processing made
of it) through :meth:`Sink.submit` and later reports each item done, or failed, through the
``on_complete`` callback. The engine commits a source offset only after that report, so
"done" must mean durably written: a Kafka delivery report, a Spark job that succeeded.

Record sinks (Kafka) complete items one by one; batch sinks (Spark) collect items and complete
a whole batch at once when its job succeeds. Both fit the same calls, so the engine has no
special case for either:

- ``submit`` hands over an item; it must not block for long (the processing thread calls it).
- ``poll`` lets the sink make progress and fire callbacks (the engine loop calls it often);
  a batch sink starts a job here once a batch reaches its bounds.
- ``drain`` completes what was submitted for the given partitions (all when None) within a
  timeout: a batch sink closes its open batches now. Used on revoke and shutdown.
- ``abandon`` drops the unfinished items of partitions this worker no longer owns.
- ``close`` releases resources after the final drain; calling it again does nothing.

What the engine relies on (tests/contract/test_sink_contract.py runs it on every sink):

- Every submitted item completes exactly once, done or failed, unless ``abandon`` dropped it
  first. An item with several values (one record the processor turned into many) completes
  once, when all of them are written. A ``submit`` that raises gives the item back: it never
  completes (the engine gives it up itself; values sent before the error may be written).
- ``on_complete`` runs only inside the sink's own ``submit``, ``poll`` or ``drain``, on the
  thread that called it, never on a thread of the sink's own; so the engine chooses where its
  callback runs (the processing thread and the poll loop both call ``poll``).
- ``drain`` returns once every item of those partitions has completed (True), or when the
  timeout has passed (False, to be called again).
- An abandoned item never completes; items of other partitions are untouched, and the
  abandoned partitions take new items as usual (they may be assigned back).

A sink reports errors only once it has given up (its own retries are its business); the
engine then applies ``spec.errors.policy`` to the item's source record.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from offtake.records import Record, TopicPartition


@dataclass(slots=True)
class SinkItem:
    """A source record and what processing made of it (zero, one or more values)."""

    record: Record
    values: list[Any]
    epoch: int = 0
    attempts: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tp(self) -> TopicPartition:
        return self.record.tp


OnComplete = Callable[[SinkItem, BaseException | None], None]


class SinkError(Exception):
    """A sink gave up on an item; the message says why and where."""


class Sink(ABC):
    """Base class of every sink; see the module docstring for the contract."""

    name: str = "sink"

    def __init__(self) -> None:
        self._on_complete: OnComplete | None = None

    def start(self, on_complete: OnComplete) -> None:
        """Called once by the engine before the first submit."""
        self._on_complete = on_complete

    def complete(self, item: SinkItem, error: BaseException | None = None) -> None:
        """Report an item done (error None) or given up; only from submit, poll or drain."""
        assert self._on_complete is not None, "Sink.start() was not called"
        self._on_complete(item, error)

    @abstractmethod
    def submit(self, item: SinkItem) -> None: ...

    def poll(self) -> None:
        """Make progress and fire completions; the default has nothing to do."""

    @abstractmethod
    def drain(self, partitions: Collection[TopicPartition] | None, timeout: float) -> bool:
        """Complete submitted items (of these partitions; all if None). True if all done."""

    def abandon(self, partitions: Collection[TopicPartition]) -> int:
        """Drop unfinished work of partitions this worker no longer owns; returns items dropped.

        Called when a revoke's drain budget ran out and for lost partitions. Their records will
        be processed again by the new owner, so a batch sink must not write them late (a late
        write could replace rows the new owner already committed). A record sink cannot take
        back what it has sent, but it must not report those items either: the engine has
        forgotten them. The default suits a sink that completes every item inside ``submit``.
        """
        return 0

    def close(self) -> None:
        """Release resources; called after the final drain."""
