"""When to pause and resume fetching: bounded in-flight work with hysteresis.

Pausing (not blocking) is what keeps the worker in its group: it goes on polling, so the
broker sees it alive, while no new records arrive. Resuming only below a low-water mark
avoids flapping between paused and resumed on every record.
"""

from __future__ import annotations

from dataclasses import dataclass

from offtake.config.spec import LimitsSpec

LOW_WATER = 0.5  # resume once in-flight work fell below half of each bound


@dataclass
class Backpressure:
    limits: LimitsSpec
    engaged: bool = False

    def update(self, messages: int, nbytes: int) -> bool:
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
            self.engaged = True
        return self.engaged

    def capacity(self, messages: int) -> int:
        """How many more records may be fetched now without crossing the message bound."""
        return max(0, self.limits.max_in_flight_messages - messages)
