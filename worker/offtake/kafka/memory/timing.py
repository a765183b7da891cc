"""Clocks and waits of the memory broker, in confluent-kafka's timeout conventions.

Pure functions, no state, no locking. Waits are sliced (:data:`WAIT_SLICE`) so that
time-based state (stalls ending, ``max.poll.interval.ms``) advances even when no other thread
notifies the broker's condition.
"""

from __future__ import annotations

import time

WAIT_SLICE = 0.05


def now_ms() -> int:
    """Wall-clock milliseconds, what a record's CreateTime timestamp holds."""
    return int(time.time() * 1000)


def deadline_of(timeout: float | None) -> float | None:
    """confluent-kafka's convention: None or a negative timeout waits forever."""
    if timeout is None or timeout < 0:
        return None
    return time.monotonic() + timeout


def remaining(deadline: float | None) -> float:
    """Seconds left before ``deadline``; one wait slice when there is none."""
    if deadline is None:
        return WAIT_SLICE
    return deadline - time.monotonic()
