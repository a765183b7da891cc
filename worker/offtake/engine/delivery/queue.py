"""Queue mode: each record acknowledged to its share group, from what happened to it.

A share group (``source.groupType: share``, :mod:`offtake.kafka.share_source`) has no offsets
to commit: every record a worker acquired is acknowledged on its own. This mode maps each
settlement to the acknowledgement:

- delivered, dropped by the processor, dead-lettered or sent to a retry topic: ACCEPT (done:
  the record, or its dead letter, went where the pipeline says);
- given up on under ``errors.policy: skip`` (no DLQ): REJECT, the broker's dead end. The record
  was not processed and nothing kept it, so the broker archives it as unprocessable, never
  delivered again (ACCEPT would claim it was done; a broker-side dead-letter queue, KIP-1191,
  takes rejected records, not accepted ones);
- failed under ``errors.policy: stop``, or its dead letter refused: RELEASE (the worker stops;
  the record is not lost, the next worker tries it, as an uncommitted offset would be read
  again; a refusal that persists ends at the group's delivery-count limit, where the broker
  archives the record itself);
- what the worker gives back: everything acquired and not settled when it stops (SIGTERM:
  released after the drain, so a graceful stop duplicates nothing), and a poll whose
  acquisition lock is about to run out (released just before; see :meth:`Queue.step`).

Retries use the broker's delivery count as the attempt number (:func:`first_attempt`, which
the processing stage asks through :attr:`Queue.first_attempt`): a record's earlier deliveries'
attempts were made elsewhere, or by a worker that crashed on it, so a record that crashed one
worker is retried on another and still reaches ``errors.policy`` after ``errors.maxRetries``
(past the last attempt it goes to the error policy unrun). Exactly-once is refused at
validation: Kafka has no transactional acknowledgement for share groups.

No rebalance callbacks: :meth:`revoking` and :meth:`lost` are never called.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from offtake.engine.delivery.base import DeliveryMode, Released
from offtake.engine.offsets import OffsetTracker
from offtake.engine.settlements import Settled, SettledMany, Settlement
from offtake.kafka.protocols import MessageLike
from offtake.kafka.share_source import (
    Ack,
    ShareSource,
    ShareStats,
    delivery_count,
    first_deliveries,
)
from offtake.metrics import Metrics
from offtake.records import TopicPartition

log = logging.getLogger("offtake.worker")

ACK_LABELS = {Ack.ACCEPT: "accept", Ack.RELEASE: "release", Ack.REJECT: "reject"}
#: How each settlement is acknowledged (see the module docstring).
ACKS: dict[Settlement, Ack] = {
    "delivered": Ack.ACCEPT,
    "dropped": Ack.ACCEPT,
    "dlq": Ack.ACCEPT,
    "retried": Ack.ACCEPT,
    "skipped": Ack.REJECT,
    "failed": Ack.RELEASE,
}


def until_settled(
    progress: Callable[[], int], wait: Callable[[float, int], None], waiting: Callable[[], bool]
) -> Callable[[float], None]:
    """The share source's wait while a poll is out (ShareSource.idle_wait): it ends as soon as
    the processing thread settles records (``progress``/``wait``: the stage's progress mark and
    wait, ``waiting``: settlements not taken yet), not a fixed sleep later. The last
    settlement of a poll is what lets the next poll come."""

    def idle_wait(timeout: float) -> None:
        mark = progress()  # before looking: progress from here on ends the wait
        if not waiting():
            wait(timeout, mark)

    return idle_wait


def first_attempt(msg: MessageLike) -> int:
    """A share group's record starts its attempts at the broker's delivery count."""
    return delivery_count(msg) or 1


class Queue(DeliveryMode):
    """Per-record acknowledgement to a share group (see the module docstring)."""

    def __init__(self, tracker: OffsetTracker, source: ShareSource, metrics: Metrics) -> None:
        super().__init__(tracker)
        self.source = source
        self.metrics = metrics
        self._exported = ShareStats()
        self._revision = -1  # the source's revision the gauges were last set from

    @property
    def first_attempt(self) -> Callable[[MessageLike], int]:
        return first_attempt

    @property
    def all_first_attempts(self) -> Callable[[list[MessageLike]], bool]:
        return first_deliveries

    def settle(self, settled: Settled | SettledMany) -> int:
        if self.tracker.epoch(settled.tp) != settled.epoch:
            # Its poll was given back (see step): the record may be acquired again, by this
            # worker too, and is not this settlement's to acknowledge.
            return 0
        n = super().settle(settled)
        kind = ACKS[settled.how]
        if isinstance(settled, SettledMany):
            self.source.acknowledge_many(settled.tp, settled.offsets, kind)
        else:
            self.source.acknowledge(settled.tp, settled.offset, kind)
        self._let_go_if_done()
        return n

    def _let_go_if_done(self) -> None:
        """Once a poll is wholly acknowledged, its records leave the tracker (nothing of them
        is in flight any more) and the source may poll again."""
        if self.source.acquired == 0 and self.tracker.inflight_messages:
            for tp in self.tracker.partitions():
                self.tracker.acknowledged(tp)

    def step(self, now: float) -> None:
        expiring = self.source.release_expiring()
        if expiring:
            # The poll's lock runs out before its records finish: they went back to the group
            # (another worker takes them at once). Drop their work here, and renew the
            # partitions' epochs: a late settlement of theirs is stale (not acknowledged: the
            # record may be acquired again, here or elsewhere), and the stage drops their work.
            partitions = {tp for tp, _ in expiring}
            self.loop.abandon(partitions)
            for tp in partitions:
                self.tracker.renew(tp)
            self.loop.assignment_changed()
        self._let_go_if_done()
        self.source.flush()
        self.source.refresh_backlog()
        self._export()

    def _export(self) -> None:
        stats, done = self.source.stats, self._exported
        for kind, label in ACK_LABELS.items():
            if stats.acknowledged[kind] > done.acknowledged[kind]:
                delta = stats.acknowledged[kind] - done.acknowledged[kind]
                self.metrics.share_acknowledged.labels(label).inc(delta)
                done.acknowledged[kind] = stats.acknowledged[kind]
        for attr, counter in (
            ("redelivered", self.metrics.share_redelivered),
            ("late", self.metrics.share_lock_expired.labels("late")),
            ("released_before_expiry", self.metrics.share_lock_expired.labels("released")),
        ):
            delta = getattr(stats, attr) - getattr(done, attr)
            if delta:
                counter.inc(delta)
                setattr(done, attr, getattr(stats, attr))
        for topic, n in self.source.take_acquired_by_topic().items():
            self.metrics.share_acquired.labels(topic).inc(n)
        if self._revision == self.source.revision:
            return  # the gauges below changed with no poll and no refresh: every step is often
        self._revision = self.source.revision
        for tp, age in self.source.acquired_ages.items():
            # Lag in seconds only: a share group commits no offsets to count messages from,
            # so no lag-in-messages series rather than a wrong 0.
            self.metrics.lag_seconds.labels(tp.topic, str(tp.partition)).set(age)
        for tp, offset in self.source.frontier.items():
            self.metrics.share_acquired_offset.labels(tp.topic, str(tp.partition)).set(offset)
        for tp, behind in self.source.backlog.items():
            self.metrics.share_backlog.labels(tp.topic, str(tp.partition)).set(behind)

    def revoking(self, partitions: set[TopicPartition], deadline: float) -> Released:
        return Released(drained=True, committed=True)  # a share group revokes nothing

    def end(self, drained: bool) -> None:
        pass  # records still settle while the processing thread runs: see final_commit

    def final_commit(self, deadline: float) -> None:
        """The processing thread stopped: release what it did not deliver (another worker
        takes it at once), send every acknowledgement, wait for the broker's answer."""
        released = self.source.release_all()
        self.source.send_acknowledgements(deadline)
        self._export()
        if released:
            log.info("released %d record(s) not delivered to the share group", released)
