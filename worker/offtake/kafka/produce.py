"""Producing when librdkafka's local queue may be full."""

from __future__ import annotations

import time
from typing import Any

from offtake.kafka.protocols import ProducerLike

QUEUE_FULL_WAIT = 0.05


def produce_waiting(
    producer: ProducerLike, topic: str, deadline: float | None = None, **kwargs: Any
) -> None:
    """``producer.produce``, waiting while the local queue is full instead of failing.

    A full queue (BufferError) means deliveries are behind: serving delivery reports makes
    room. This blocks only the calling thread, never the poll loop that keeps a worker in its
    group, and it is what turns a slow broker into backpressure rather than an error.

    ``deadline`` (a :func:`time.monotonic` instant) bounds the wait for a queue that may never
    drain by itself: past it the last BufferError is raised. None waits as long as it takes.
    """
    while True:
        try:
            producer.produce(topic, **kwargs)
            return
        except BufferError:
            if deadline is not None and time.monotonic() >= deadline:
                raise
            producer.poll(QUEUE_FULL_WAIT)
