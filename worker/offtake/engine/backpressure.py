"""When to pause and resume fetching: bounded in-flight work with hysteresis.

Pausing (not blocking) is what keeps the worker in its group: it goes on polling, so the
broker sees it alive, while no new records arrive. Resuming only below a low-water mark
avoids flapping between paused and resumed on every record.

Reaching the bound is not yet a reason to pause: at full speed the in-flight count touches it
whenever the records done wait for their commit's acknowledgement, and the poll loop then
simply fetches nothing more (:meth:`InFlightGate.capacity`) until the commit frees room. A
pause costs librdkafka's prefetched records (dropped, fetched again on resume: most of a
second), so it is kept for a bound held for ``grace`` seconds: a stalled sink.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from offtake.config.spec import LimitsSpec
from offtake.kafka.source import Source
from offtake.metrics import Metrics
from offtake.records import TopicPartition

log = logging.getLogger("offtake.worker")

LOW_WATER = 0.5  # resume once in-flight work fell below half of each bound


@dataclass
class InFlightGate:
    """The in-flight bound: how much may still be fetched, and when to pause for a stall.

    Not :class:`offtake.Backpressure`, the processor's "slow down" (one partition, a delay
    it names): that one is held by :class:`PartitionPauser` through the processing thread.
    """

    limits: LimitsSpec
    grace: float = 0.0  # seconds at the bound before pausing
    engaged: bool = False
    _at_bound_since: float | None = None

    def update(self, messages: int, nbytes: int, now: float = 0.0) -> bool:
        """Return whether fetching should be paused, given the in-flight totals."""
        if self.engaged:
            if (
                messages <= self.limits.max_in_flight_messages * LOW_WATER
                and nbytes <= self.limits.max_in_flight_bytes * LOW_WATER
            ):
                self.engaged = False
        elif (
            messages >= self.limits.max_in_flight_messages
            or nbytes >= self.limits.max_in_flight_bytes
        ):
            if self._at_bound_since is None:
                self._at_bound_since = now
            if now - self._at_bound_since >= self.grace:
                self.engaged = True
        else:
            self._at_bound_since = None
        if self.engaged:
            self._at_bound_since = None
        return self.engaged

    def capacity(self, messages: int, nbytes: int = 0) -> int:
        """How many more records may be fetched now without crossing either bound."""
        if nbytes >= self.limits.max_in_flight_bytes:
            return 0
        return max(0, self.limits.max_in_flight_messages - messages)


class PartitionPauser:
    """The one owner of pause state: which partitions are paused, and why.

    Three reasons, any keeps a partition paused: backpressure (or a shutdown), which pauses
    every assigned partition; a retry delay, which holds one retry-topic partition until its
    next record is due (see :mod:`offtake.engine.retry_topics`); and a full share, which stops
    fetching a partition that holds its share of the in-flight bound while calls run
    concurrently (:meth:`share`). A partition resumes only once none holds. Keeps the set of
    partitions paused for backpressure, so a partition assigned under backpressure is paused too
    and a revoked one is forgotten. Runs on the poll loop's thread.
    """

    def __init__(self, source: Source, metrics: Metrics) -> None:
        self.source = source
        self.metrics = metrics
        self.paused: set[TopicPartition] = set()  # for backpressure or shutdown
        self.held: dict[TopicPartition, float] = {}  # retry delay: until (time.time())
        self.full: set[TopicPartition] = set()  # holding their share of the in-flight bound

    def apply(
        self, assigned: set[TopicPartition], pause: bool, why: str = "", quiet: bool = False
    ) -> None:
        """Pause (or resume) ``assigned``; ``quiet`` for pauses that are not backpressure."""
        if pause:
            todo = assigned - self.paused
            if todo:
                self.source.pause(todo - self.held.keys() - self.full)  # paused already
                self.paused |= todo
                if not quiet:
                    log.info("backpressure: paused %d partition(s)%s", len(todo), why)
        elif self.paused:
            todo = self.paused & assigned
            if todo:
                self.source.resume(todo - self.held.keys() - self.full)  # still held
                log.info("backpressure released: resumed %d partition(s)", len(todo))
            self.paused = set()
        self.paused &= assigned
        self.metrics.paused_partitions.set(len(self.paused))

    def hold(self, tp: TopicPartition, offset: int, until: float) -> bool:
        """Pause ``tp`` until ``until`` (wall clock) and fetch it from ``offset`` after.

        The record at ``offset`` and any fetched behind it were not taken; seeking back makes
        the consumer fetch them again on resume (librdkafka drops what it had fetched past it).
        False if the consumer refused the seek: the record must then be taken now, early,
        rather than skipped.
        """
        try:
            self.source.seek(tp, offset)
        except Exception as exc:  # KafkaException: the partition's state does not allow it
            log.warning(
                "cannot hold %s at %d for its retry delay (%s): taking it now", tp, offset, exc
            )
            return False
        if tp not in self.paused and tp not in self.held and tp not in self.full:
            self.source.pause([tp])
        self.held[tp] = until
        self.metrics.delayed_partitions.set(len(self.held))
        return True

    def delay(self, tp: TopicPartition, until: float) -> None:
        """Pause ``tp`` until ``until`` (wall clock), fetching on from where it is after.

        For offtake.Backpressure: the processing thread holds the records it has of ``tp``
        in order, so the consumer's position is right and no seek is needed.
        """
        if tp not in self.paused and tp not in self.held and tp not in self.full:
            self.source.pause([tp])
        self.held[tp] = max(until, self.held.get(tp, until))
        self.metrics.delayed_partitions.set(len(self.held))

    def release_due(self, now: float) -> None:
        """Resume the held partitions whose record is due (unless backpressure holds them)."""
        due = [tp for tp, until in self.held.items() if until <= now]
        if not due:
            return
        for tp in due:
            del self.held[tp]
        self.source.resume([tp for tp in due if tp not in self.paused and tp not in self.full])
        self.metrics.delayed_partitions.set(len(self.held))

    def share(
        self,
        full: set[TopicPartition],
        below: set[TopicPartition],
        consumed_to: Callable[[TopicPartition], int | None],
    ) -> None:
        """Stop fetching the partitions in ``full``; fetch again those in ``below`` (unless
        another reason holds them).

        With calls in flight concurrently, a partition's records wait behind their busy lanes
        (keys) until their turn. librdkafka hands out a poll's records a partition at a time,
        so without a share the in-flight bound fills with the records of the first partitions
        fetched, and the other partitions' keys get no call at all (10 keys on 12 partitions:
        2 calls in flight of 64). Pausing drops what librdkafka prefetched of the partition;
        it fetches on from the consumer's position on resume: nothing is skipped or repeated.
        """
        start = full - self.full
        if start:
            self.source.pause(start - self.paused - self.held.keys())
            self.full |= start
        stop = below & self.full
        if stop:
            self.full -= stop
            resume = stop - self.paused - self.held.keys()
            for tp in resume:
                # Fetch on from the last record handed out, said explicitly: pause and resume
                # are asynchronous in librdkafka, and the position it saved at the pause may
                # not be the last one consume() returned.
                offset = consumed_to(tp)
                if offset is not None:
                    try:
                        self.source.seek(tp, offset)
                    except Exception as exc:  # KafkaException: not seekable now
                        log.warning("cannot seek %s to %d before resuming it: %s", tp, offset, exc)
            self.source.resume(resume)

    def fresh(self, partitions: set[TopicPartition]) -> None:
        """Newly assigned partitions fetch unless paused here. librdkafka keeps a partition's
        pause across rebalances: one paused under backpressure, lost (a broker failover) and
        assigned again stayed paused for good with nothing here to resume it (found by the
        chaos suite, tests/chaos/test_worker_and_broker_faults.py). Resuming one that is not
        paused is a no-op."""
        self.source.resume(partitions - self.paused - self.held.keys() - self.full)

    def forget(self, partitions: set[TopicPartition]) -> None:
        self.paused -= partitions
        self.full -= partitions
        for tp in partitions:
            self.held.pop(tp, None)
        self.metrics.paused_partitions.set(len(self.paused))
        self.metrics.delayed_partitions.set(len(self.held))
