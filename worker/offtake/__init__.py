"""Offtake: Kafka consumer pipelines done right.

What a processing function may use: :class:`Record` (what it receives) and
:class:`Backpressure` (raise it to say "slow down": the record's partition pauses for
``retry_after`` seconds, without counting a failure).

The errors a user acts on: :class:`OfftakeError`, the root of every exception Offtake raises
(offtake/errors.py), and of those :class:`ConfigError` (a manifest field is wrong; names the
field), :class:`DecodeError` (a record's value is not valid for ``source.format``; names the
record) and :class:`SinkError` (a sink gave up on a record). The last three are imported on
first use: ``import offtake`` stays as light as the processing function's own import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from offtake.errors import OfftakeError
from offtake.processing.base import Backpressure
from offtake.records import Record

if TYPE_CHECKING:
    from offtake.config._fields import ConfigError
    from offtake.formats.errors import DecodeError
    from offtake.sinks.base import SinkError

# Where each lazily exported name is defined: importing them eagerly would load the manifest
# loader (and yaml) for every process that only needs Record, stop_signals or the CLI's start.
_LAZY = {
    "ConfigError": "offtake.config._fields",
    "DecodeError": "offtake.formats.errors",
    "SinkError": "offtake.sinks.base",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'offtake' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "Backpressure",
    "ConfigError",
    "DecodeError",
    "OfftakeError",
    "Record",
    "SinkError",
]
