"""The timestamp of a partition's oldest uncommitted record when the worker has not fetched it.

Lag in seconds is the age of the oldest record not yet committed, read from that record's
timestamp. Usually the record is in the worker's memory. A lagging partition whose records
were not fetched yet (the worker takes only what it can process, partition after partition)
would otherwise report 0 seconds, hiding exactly the stuck partition an alert should see. This
probe reads the one record at the committed offset with a separate consumer that joins no
group and commits nothing, on its own thread so that the poll loop never waits for it.

:func:`read_timestamps` is the reading itself, shared with the operator, which measures lag in
seconds from the broker for every partition of a pipeline (offtake_operator/lag.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from offtake.kafka.protocols import ConsumerLike
from offtake.records import TopicPartition

log = logging.getLogger("offtake.lag")

PEEK_TIMEOUT = 2.0


def read_timestamps(
    consumer: ConsumerLike,
    positions: Mapping[TopicPartition, int],
    make_tp: Callable[[str, int, int], Any],
    timeout: float,
) -> dict[TopicPartition, int]:
    """Timestamp (ms) of the record at each position, read with a consumer that joins no group.

    The consumer is assigned the positions (never subscribed) and unassigned after, so that it
    stops fetching; partitions that do not answer within ``timeout`` are left out.
    """
    if not positions:
        return {}
    consumer.assign([make_tp(tp.topic, tp.partition, offset) for tp, offset in positions.items()])
    found: dict[TopicPartition, int] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(found) < len(positions):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for msg in consumer.consume(num_messages=len(positions), timeout=min(left, 0.5)):
                if msg.error() is not None:
                    continue
                tp = TopicPartition(msg.topic() or "", msg.partition() or 0)
                ts_type, ts = msg.timestamp()
                if tp in positions and tp not in found and ts_type and ts >= 0:
                    found[tp] = int(ts)
    finally:
        consumer.assign([])  # stop fetching these partitions
    return found


class OldestRecordProbe:
    def __init__(
        self, make_consumer: Callable[[], ConsumerLike], make_tp: Callable[[str, int, int], Any]
    ) -> None:
        self._make_consumer = make_consumer
        self._make_tp = make_tp
        self._consumer: ConsumerLike | None = None
        self._wanted: dict[TopicPartition, int] = {}
        self._found: dict[tuple[TopicPartition, int], int | None] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def timestamp(self, tp: TopicPartition, offset: int) -> int | None:
        """The timestamp (ms) of the record at ``offset``, once read; asks for it otherwise."""
        with self._cond:
            if (tp, offset) in self._found:
                return self._found[tp, offset]
            self._wanted[tp] = offset
            self._cond.notify()
        self._ensure_thread()
        return None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(PEEK_TIMEOUT + 1)

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="offtake-lag-probe", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._wanted and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        return
                    tp, offset = self._wanted.popitem()
                ts = self._peek(tp, offset)
                with self._cond:
                    # Keep only the latest answer per partition: offsets only move forward.
                    for key in [k for k in self._found if k[0] == tp]:
                        del self._found[key]
                    self._found[tp, offset] = ts
        finally:
            if self._consumer is not None:
                self._consumer.close()

    def _peek(self, tp: TopicPartition, offset: int) -> int | None:
        try:
            if self._consumer is None:
                self._consumer = self._make_consumer()
            found = read_timestamps(self._consumer, {tp: offset}, self._make_tp, PEEK_TIMEOUT)
            return found.get(tp)
        except Exception as exc:  # lag in seconds is best effort; consuming must go on
            log.debug("could not read the record at %s@%d: %s", tp, offset, exc)
        return None
