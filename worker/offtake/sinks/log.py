"""The log sink: prints each value as a JSON line; for demos and tests."""

from __future__ import annotations

import json
import sys
from collections.abc import Collection
from typing import Any, TextIO

from offtake.records import TopicPartition
from offtake.sinks.base import Sink, SinkBatch, SinkError


class LogSink(Sink):
    """Writes one line per value to a stream; a batch is settled once written and flushed."""

    name = "log"

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__()
        # None: sys.stdout as it is at each write, so a redirection made after the sink was
        # built (contextlib.redirect_stdout, pytest's capture) applies to it.
        self.stream = stream

    def submit(self, batch: SinkBatch) -> None:
        out = self.stream or sys.stdout
        failed: dict[int, BaseException] = {}
        for i, item in enumerate(batch.items):
            r = item.record
            try:
                for value in item.values:
                    line = {
                        "topic": r.topic,
                        "partition": r.partition,
                        "offset": r.offset,
                        "key": _text(r.key),
                        "value": _jsonable(value),
                    }
                    out.write(json.dumps(line, default=str) + "\n")
                out.flush()
            except Exception as exc:  # this record fails, not its neighbours
                failed[i] = SinkError(f"record {r.where()}: writing to the log failed: {exc}")
        self.settle(batch, failed)

    def drain(self, partitions: Collection[TopicPartition] | None, timeout: float) -> bool:
        return True


def _text(b: bytes | None) -> str | None:
    return None if b is None else b.decode("utf-8", "replace")


def _jsonable(value: Any) -> Any:
    return _text(value) if isinstance(value, bytes) else value
