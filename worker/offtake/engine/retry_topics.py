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

import time
from collections.abc import Callable, Sequence
from typing import Any

from offtake.config.spec import ErrorsSpec, retry_topic_name
from offtake.engine.dead_letters import H_ATTEMPTS, H_RETRY_DUE, H_RETRY_TOPIC, dlq_headers, header
from offtake.kafka.produce import produce_waiting
from offtake.kafka.protocols import ProducerLike
from offtake.records import Record


class RetryRoute:
    """The retry topics of a pipeline's source topics, in order; immutable once built."""

    def __init__(self, source_topics: Sequence[str], delays: Sequence[int]) -> None:
        self.delays = tuple(delays)
        # retry topic -> (its source topic, its index in delays)
        self._hops: dict[str, tuple[str, int]] = {
            retry_topic_name(t, d): (t, i) for t in source_topics for i, d in enumerate(delays)
        }
        self.topics = frozenset(self._hops)

    @classmethod
    def of(cls, errors: ErrorsSpec, source_topics: Sequence[str]) -> RetryRoute | None:
        if not errors.retry_topics:
            return None
        return cls(source_topics, [r.delay_seconds for r in errors.retry_topics])

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
        """Attempts made before this one reached its retry topic (0 on a source topic)."""
        if record.topic not in self._hops:
            return 0
        text = header(record.headers, H_ATTEMPTS)
        return int(text) if text is not None and text.isdigit() else 0

    def due_ms(
        self, topic: str, headers: Sequence[tuple[str, bytes | None]] | None, timestamp: int | None
    ) -> int | None:
        """When a record of retry topic ``topic`` may be processed (ms since the epoch).

        The ``offtake.retry.due`` header says; a record without it (produced by hand) is due
        its timestamp plus the topic's delay; None (at once) if neither is known.
        """
        text = header(headers, H_RETRY_DUE)
        if text is not None and text.isdigit():
            return int(text)
        if timestamp is None or timestamp < 0:
            return None
        _, index = self._hops[topic]
        return timestamp + self.delays[index] * 1000


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
