"""The sink contract: where processed records go, and how a sink says they are settled.

A sink receives a :class:`SinkBatch` (records of one partition from one poll, in offset
order: the engine's unit) through :meth:`Sink.submit` and later reports it settled with one
:meth:`Sink.settle`: the batch, and the records of it that failed and why (by index). That is
the one way back from a sink. The engine commits a source offset only after the settlement, so
"settled" without an error must mean durably written: a Kafka delivery report, a Spark job
that succeeded. A batch holds either processed records (:attr:`SinkBatch.items`, one
:class:`SinkItem` per record with the values processing made of it) or, for a sink that
:attr:`Sink.forwards`, consumed records to write unchanged (:attr:`SinkBatch.messages`:
pass-through, no processor and ``format: bytes``; no object made per record). The log sink
settles a batch inside ``submit``; the Kafka sink once every delivery report of its values is
in; the Spark sink regroups records into its own bounded batches (one partition each) and
settles each of those when its job succeeded, so a submitted batch may settle in parts, each
part a :class:`SinkBatch` of its own records. The calls:

- ``submit`` hands over a batch; it must not block for long (the processing thread calls it)
  and does not raise for a record: a record the sink cannot take (a name Spark cannot use, a
  value too large for Kafka) fails in the settlement, its neighbours are not touched.
- ``poll`` lets the sink make progress and settle (the processing thread calls it between
  batches); a batch sink starts a job here once a batch reaches its bounds.
- ``drain`` settles what was submitted for the given partitions (all when None) within a
  timeout: a batch sink closes its open batches now. Used on revoke, on shutdown and before
  each exactly-once transaction commit.
- ``abandon`` drops the unsettled records of partitions this worker no longer owns.
- ``close`` releases resources after the final drain; calling it again does nothing.

What the engine relies on (tests/contract/test_sink_contract.py runs it on every sink):

- Every submitted record settles exactly once, delivered or failed, unless ``abandon`` dropped
  it first. A record with several values (one record the processor turned into many) settles
  once, when all of them are written.
- Every settlement runs only inside the sink's own ``submit``, ``poll`` or ``drain``, on the
  thread that called it, never on a thread of the sink's own; so the engine chooses where its
  callback runs: in the engine the processing thread makes all of those calls.
- ``drain`` returns once every record of those partitions has settled (True), or when the
  timeout has passed (False, to be called again).
- An abandoned record never settles; records of other partitions are untouched, and the
  abandoned partitions take new batches as usual (they may be assigned back).

A sink fails a record only once it has given up (its own retries are its business); the
engine then applies ``spec.errors.policy`` to the record.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from offtake.errors import OfftakeError
from offtake.kafka.protocols import MessageLike
from offtake.records import Record, TopicPartition


class SinkItem(NamedTuple):
    """A source record and what processing made of it (zero, one or more values).

    A named tuple: routing makes one per processed record, with ``tuple.__new__`` (a quarter
    of a dataclass's time). A sink that must change one (the Spark sink counts its own
    attempts) puts a ``_replace``-d copy in its place in the batch."""

    record: Record
    values: list[Any]
    epoch: int = 0
    attempts: int = 1

    @property
    def tp(self) -> TopicPartition:
        return self.record.tp


@dataclass(slots=True)
class SinkBatch:
    """Records of one partition (of one assignment, ``epoch``), in offset order, handed to a
    sink together and settled together: processed records (``items``) or, for a sink that
    forwards, consumed records to write unchanged (``messages``; ``items`` empty).

    ``offsets`` are the records' offsets, index for index; :meth:`Sink.settle`'s failures are
    keyed by that index.
    """

    tp: TopicPartition
    epoch: int
    offsets: list[int]
    items: list[SinkItem] = field(default_factory=list)
    messages: list[MessageLike] | None = None
    submitted: float = 0.0  # time.monotonic() when handed to the sink, for the sink latency

    @classmethod
    def of(cls, items: list[SinkItem], submitted: float = 0.0) -> SinkBatch:
        """The batch of these items (of one partition and epoch, in offset order)."""
        first, offsets = items[0], [it.record.offset for it in items]
        return cls(first.tp, first.epoch, offsets, items, None, submitted)

    def __len__(self) -> int:
        return len(self.offsets)

    def where(self, i: int) -> str:
        """Where record ``i`` came from, for error messages (as :meth:`Record.where`)."""
        return f"{self.tp.topic}[{self.tp.partition}]@{self.offsets[i]}"


NO_FAILURES: Mapping[int, BaseException] = MappingProxyType({})

# The one way back: a settled batch, and its failed records' errors by index in it.
OnSettled = Callable[[SinkBatch, Mapping[int, BaseException]], None]


class SinkError(OfftakeError):
    """A sink gave up on a record; the message says why and where."""


class SinkHalt(SinkError):
    """The sink cannot go on without someone's decision (an incompatible schema change of its
    table): the engine stops the pipeline whatever ``errors.policy`` says, and commits nothing
    at or past the record. Not the record's fault, so never a dead letter."""


class Sink(ABC):
    """Base class of every sink; see the module docstring for the contract."""

    name: str = "sink"
    forwards: bool = False  # takes batches of consumed records (SinkBatch.messages)

    def __init__(self) -> None:
        self._on_settled: OnSettled | None = None

    def start(self, on_settled: OnSettled) -> None:
        """Called once by the engine before the first submit: where :meth:`settle` reports."""
        self._on_settled = on_settled

    def settle(self, batch: SinkBatch, failed: Mapping[int, BaseException] = NO_FAILURES) -> None:
        """Report ``batch`` settled; ``failed`` maps the index of each failed record to why.
        Only from submit, poll or drain."""
        assert self._on_settled is not None, "Sink.start() was not called"
        self._on_settled(batch, failed)

    @abstractmethod
    def submit(self, batch: SinkBatch) -> None:
        """Hand over a batch; it settles later (or before this returns) with :meth:`settle`."""

    def poll(self) -> None:
        """Make progress and settle what is done; the default has nothing to do."""

    @abstractmethod
    def drain(self, partitions: Collection[TopicPartition] | None, timeout: float) -> bool:
        """Settle submitted records (of these partitions; all if None). True if all settled."""

    def abandon(self, partitions: Collection[TopicPartition]) -> int:
        """Drop unsettled records of partitions this worker no longer owns; returns how many.

        Called when a revoke's drain budget ran out and for lost partitions. Their records will
        be processed again by the new owner, so a batch sink must not write them late (a late
        write could replace rows the new owner already committed). A record sink cannot take
        back what it has sent, but it must not settle those records either: the engine has
        forgotten them. The default suits a sink that settles every batch inside ``submit``.
        """
        return 0

    def close(self) -> None:
        """Release resources; called after the final drain."""
