"""The queue-mode example's function (examples/queue-mode.yaml): a work item that waits on
another service, simulated. Each record says how long its call takes (``seconds``), so a
backlog of them is what queue mode is for: slow, independent records, more workers than
partitions taking them.
"""

from __future__ import annotations

import time
from typing import Any

from offtake import Record


def handle(record: Record) -> dict[str, Any]:
    job = record.value
    if not isinstance(job, dict):
        raise TypeError(f"expected a JSON object, got {type(job).__name__}")
    seconds = float(job.get("seconds", 0.0))
    if not 0 <= seconds <= 60:
        raise ValueError(f"seconds: expected 0 to 60, got {seconds}")
    time.sleep(seconds)  # the call to the other service
    return {**job, "done": True}
