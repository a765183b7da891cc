"""Offtake: Kafka consumer pipelines done right.

What a processing function may use: :class:`Record` (what it receives) and
:class:`Backpressure` (raise it to say "slow down": the record's partition pauses for
``retry_after`` seconds, without counting a failure).
"""

from offtake.processing.base import Backpressure
from offtake.records import Record

__all__ = ["Backpressure", "Record"]
