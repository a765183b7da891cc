"""Retry topics: non-blocking retries (``errors.retryTopics``), as Spring Kafka and Karafka do.

A record whose in-place retries are spent is sent to the next retry topic of its source topic
(``orders.retry-10s``, ``orders.retry-60s``, ...) with headers saying where it came from, how
often it failed and why, and when it is due (``offtake.retry.due``, ms since the epoch: the
send time plus the delay). Once the broker confirmed that send, the record is settled on the
topic it was consumed from, like a dead letter, so its offset can be committed. The same
pipeline consumes its retry topics; after the last one, ``errors.policy`` applies.

Two halves, on the two threads:

- :class:`RetrySender` (processing thread, which owns the producer): the sends. With
  ``sink.kafka.delivery: exactly-once`` its producer is the sink's transactional one, so a
  retry send commits with the offsets, like a dead letter.
- :class:`RetryRoute` (read by both, immutable): which topic is which hop, the next hop, and
  when a consumed retry record is due. The poll loop holds a retry partition whose next record
  is not yet due: it pauses it and seeks back to that record (the pause state has one owner,
  :class:`~offtake.engine.backpressure.PartitionPauser`), and resumes it when the record is
  due. It never sleeps, so the other partitions flow and the worker stays in its group.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from offtake.config.spec import ErrorsSpec, retry_topic_name
from offtake.engine.dead_letters import dlq_headers
from offtake.engine.header_values import HeaderError, HeaderList, read_int
from offtake.headers import H_ATTEMPTS, H_RETRY_DUE, H_RETRY_TOPIC
from offtake.kafka.produce import produce_waiting
from offtake.kafka.protocols import ProducerLike
from offtake.records import Record

log = logging.getLogger("offtake.retry")


class RetryRoute:
    """The retry topics of a pipeline's source topics, in order; immutable once built."""

    def __init__(
        self, source_topics: Sequence[str], delays: Sequence[int], max_retries: int | None = None
    ) -> None:
        self.delays = tuple(delays)
        #: Tries per topic (errors.maxRetries + 1): bounds the attempts a header may claim.
        self._tries = None if max_retries is None else max_retries + 1
        # retry topic -> (its source topic, its index in delays)
        self._hops: dict[str, tuple[str, int]] = {
            retry_topic_name(t, d): (t, i) for t in source_topics for i, d in enumerate(delays)
        }
        self.topics = frozenset(self._hops)

    @classmethod
    def of(cls, errors: ErrorsSpec, source_topics: Sequence[str]) -> RetryRoute | None:
        if not errors.retry_topics:
            return None
        return cls(
            source_topics, [r.delay_seconds for r in errors.retry_topics], errors.max_retries
        )

    def is_retry(self, topic: str) -> bool:
        return topic in self._hops

    def next_hop(self, topic: str) -> tuple[str, int] | None:
        """(retry topic, delay in seconds) after ``topic``, or None after the last one."""
        source, index = self._hops.get(topic, (topic, -1))
        index += 1
        if index >= len(self.delays):
            return None
        return retry_topic_name(source, self.delays[index]), self.delays[index]

    def prior_attempts(self, record: Record) -> int:
        """Attempts made before this one reached its retry topic (0 on a source topic).

        Read strictly from ``offtake.attempts`` and bounded by what the hops allow (each topic
        before this one had at most ``maxRetries + 1`` tries): anyone who can write to a retry
        topic can set that header. It only ever labels the dead letter (which hop comes next is
        decided by the topic, never by a count), so a bad one counts as 0 and is logged.
        """
        hop = self._hops.get(record.topic)
        if hop is None:
            return 0
        try:
            claimed = read_int(record.headers, H_ATTEMPTS) or 0
        except HeaderError as exc:
            log.warning("%s@%d: %s; counting 0 earlier attempts", record.tp, record.offset, exc)
            return 0
        if self._tries is None:
            return claimed
        return min(claimed, (hop[1] + 1) * self._tries)

    def due_ms(self, topic: str, headers: HeaderList | None, timestamp: int | None) -> int | None:
        """When a record of retry topic ``topic`` may be processed (ms since the epoch).

        Offtake stamps a retry record with its send time and writes ``offtake.retry.due`` = that
        time plus the topic's delay; a record without a readable header (produced by hand) is
        due its timestamp plus the delay; None (at once) if neither is known. A header later
        than timestamp plus delay is not Offtake's and is capped: no header can hold a
        partition longer than its topic's delay.
        """
        _, index = self._hops[topic]
        limit = None
        if timestamp is not None and timestamp >= 0:
            limit = timestamp + self.delays[index] * 1000
        try:
            due = read_int(headers, H_RETRY_DUE)
        except HeaderError:
            due = None  # the poll loop must not stop on it: the record's timestamp decides
        if due is None:
            return limit
        return due if limit is None else min(due, limit)


class RetrySender:
    """Sends records to retry topics; ``on_done(error)`` fires when the broker confirmed.

    Only the processing thread uses it (it shares the dead-letter queue's producer), so the
    delivery callbacks fire there too.
    """

    def __init__(self, producer: ProducerLike, route: RetryRoute) -> None:
        self.producer = producer
        self.route = route

    def send(
        self,
        record: Record,
        error: BaseException,
        attempts: int,
        stage: str,
        hop: tuple[str, int],
        on_done: Callable[[BaseException | None], None],
    ) -> None:
        topic, delay = hop
        now_ms = int(time.time() * 1000)

        def delivered(err: Any, _msg: Any) -> None:
            on_done(None if err is None else RuntimeError(f"sending to {topic} failed: {err}"))

        headers = dlq_headers(
            record,
            error,
            attempts,
            stage,
            retried=self.route.is_retry(record.topic),
            extra={H_RETRY_TOPIC: topic, H_RETRY_DUE: str(now_ms + delay * 1000)},
        )
        produce_waiting(
            self.producer,
            topic,
            value=record.raw_value,
            key=record.key,
            headers=headers,
            timestamp=now_ms,
            on_delivery=delivered,
        )
