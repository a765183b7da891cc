"""The sink contract: where processed records go, and how a sink says they arrived.

A sink receives :class:`SinkItem` objects (one source record and the values processing made
of it) through :meth:`Sink.submit` or :meth:`Sink.submit_batch` and later reports each item
done, or failed. The engine commits a source offset only after that report, so "done" must
mean durably written: a Kafka delivery report, a Spark job that succeeded.

There are three ways to report, one per way of handing work over (issue 24 item 2 is to make
them one): ``on_complete`` for one item (:meth:`Sink.complete`), ``on_complete_batch`` for
items completed together (:meth:`Sink.complete_batch`), and ``on_forwarded`` for a
:class:`Forward` (:meth:`Sink.complete_forward`). The log sink completes each item inside
``submit``; the Kafka sink completes the items of one partition handed over together with one
``complete_batch`` once every delivery report of their values is in, and a forward with one
``complete_forward``; the Spark sink collects items and completes a whole batch when its job
succeeded. The calls:

- ``submit`` hands over an item; it must not block for long (the processing thread calls it).
  ``submit_batch`` hands over several at once (the engine's unit: one poll's records of a
  partition, in slices); a sink that can account for them together completes them with one
  ``complete_batch`` instead of a report per item. The default submits them one by one.
- ``forward`` (a sink with :attr:`Sink.forwards`: Kafka without a schema) writes consumed
  records unchanged, for pass-through; no :class:`SinkItem` is made for them.
- ``poll`` lets the sink make progress and fire callbacks (the processing thread calls it
  between batches); a batch sink starts a job here once a batch reaches its bounds.
- ``drain`` completes what was submitted for the given partitions (all when None) within a
  timeout: a batch sink closes its open batches now. Used on revoke, on shutdown and before
  each exactly-once transaction commit.
- ``abandon`` drops the unfinished items of partitions this worker no longer owns.
- ``close`` releases resources after the final drain; calling it again does nothing.

What the engine relies on (tests/contract/test_sink_contract.py runs it on every sink):

- Every submitted item completes exactly once, done or failed, unless ``abandon`` dropped it
  first. An item with several values (one record the processor turned into many) completes
  once, when all of them are written. A ``submit`` that raises gives the item back: it never
  completes (the engine gives it up itself; values sent before the error may be written).
- Every report (``on_complete``, ``on_complete_batch``, ``on_forwarded``) runs only inside the
  sink's own ``submit``, ``submit_batch``, ``forward``, ``poll`` or ``drain``, on the thread
  that called it, never on a thread of the sink's own; so the engine chooses where its
  callbacks run: in the engine the processing thread makes all of those calls.
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
from dataclasses import dataclass
from typing import Any

from offtake.kafka.protocols import MessageLike
from offtake.records import Record, TopicPartition


@dataclass(slots=True)
class SinkItem:
    """A source record and what processing made of it (zero, one or more values)."""

    record: Record
    values: list[Any]
    epoch: int = 0
    attempts: int = 1
    submitted: float = 0.0  # time.monotonic() when handed to the sink, for the sink latency

    @property
    def tp(self) -> TopicPartition:
        return self.record.tp


@dataclass(slots=True)
class Forward:
    """Consumed records to write unchanged (pass-through: no processor, ``format: bytes``).

    Records of one partition from one poll, in offset order, with no per-record object made
    for them: a sink that can (:attr:`Sink.forwards`) writes key, value and headers as
    consumed and completes them together with :meth:`Sink.complete_forward`.
    """

    tp: TopicPartition
    epoch: int
    messages: list[MessageLike]
    offsets: list[int]
    submitted: float = 0.0  # time.monotonic() when handed to the sink, for the sink latency


OnComplete = Callable[[SinkItem, BaseException | None], None]
# Several items finished together: the items, and the failed ones' errors by index in them.
OnCompleteBatch = Callable[[list[SinkItem], dict[int, BaseException]], None]
# A forward finished: the forward, and the failed records' errors by index in its messages.
OnForwarded = Callable[[Forward, dict[int, BaseException]], None]


class SinkError(Exception):
    """A sink gave up on an item; the message says why and where."""


class SinkHalt(SinkError):
    """The sink cannot go on without someone's decision (an incompatible schema change of its
    table): the engine stops the pipeline whatever ``errors.policy`` says, and commits nothing
    at or past the item. Not the record's fault, so never a dead letter."""


class Sink(ABC):
    """Base class of every sink; see the module docstring for the contract."""

    name: str = "sink"
    forwards: bool = False  # implements forward(): writes consumed records as they are

    def __init__(self) -> None:
        self._on_complete: OnComplete | None = None
        self._on_complete_batch: OnCompleteBatch | None = None
        self._on_forwarded: OnForwarded | None = None

    def start(
        self, on_complete: OnComplete, on_complete_batch: OnCompleteBatch | None = None
    ) -> None:
        """Called once by the engine before the first submit.

        ``on_complete_batch``, when given, receives the items a sink completes together (see
        :meth:`complete_batch`); without it they are reported one by one to ``on_complete``.
        """
        self._on_complete = on_complete
        self._on_complete_batch = on_complete_batch

    def complete(self, item: SinkItem, error: BaseException | None = None) -> None:
        """Report an item done (error None) or given up; only from submit, poll or drain."""
        assert self._on_complete is not None, "Sink.start() was not called"
        self._on_complete(item, error)

    def start_forwarding(self, on_forwarded: OnForwarded) -> None:
        """Where :meth:`complete_forward` reports; called by the engine before a forward."""
        self._on_forwarded = on_forwarded

    def complete_forward(self, forward: Forward, failed: dict[int, BaseException]) -> None:
        """Report a forward done; ``failed`` maps the index of each failed record to why."""
        assert self._on_forwarded is not None, "Sink.start_forwarding() was not called"
        self._on_forwarded(forward, failed)

    def forward(self, forward: Forward) -> None:
        """Write consumed records unchanged; only a sink with :attr:`forwards` set has it.

        They complete once, together, like a batch; a failed record does not fail the rest.
        """
        raise NotImplementedError(f"the {self.name} sink does not forward records")

    def complete_batch(self, items: list[SinkItem], failed: dict[int, BaseException]) -> None:
        """Report items done together; ``failed`` maps the index of each failed one to why."""
        if self._on_complete_batch is not None:
            self._on_complete_batch(items, failed)
            return
        for i, item in enumerate(items):
            self.complete(item, failed.get(i))

    @abstractmethod
    def submit(self, item: SinkItem) -> None: ...

    def submit_batch(self, items: list[SinkItem]) -> list[tuple[SinkItem, BaseException]]:
        """Hand over several items; returns those whose submit raised (given back, as there).

        The others complete as submitted items do. One item's failure does not touch the rest.
        """
        refused: list[tuple[SinkItem, BaseException]] = []
        for item in items:
            try:
                self.submit(item)
            except Exception as exc:
                refused.append((item, exc))
        return refused

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
