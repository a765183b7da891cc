"""In-process processing: a Python function ``module:callable``, per record or per batch.

``processor.batch: false`` (the default): the function takes one record. ``processor.batch:
true``: it takes a list of records and returns a list with one result per record, in the same
order (:class:`BatchFunctionProcessor`). Either way a result means the same: None drops the
record, a list fans it out to several values, anything else is one value.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

from offtake.processing.base import Backpressure, Outcome, Processor
from offtake.records import Record

ProcessFunction = Callable[[Record], Any]


class FunctionLoadError(ValueError):
    """processor.function does not name an importable callable."""


def load_function(path: str) -> Callable[..., Any]:
    """Import ``module:attr`` (attr may be dotted) and check that it is callable."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise FunctionLoadError(f"spec.processor.function: expected module:callable, got {path!r}")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise FunctionLoadError(
            f"spec.processor.function: cannot import module {module_name!r}: {exc}"
        ) from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise FunctionLoadError(
                f"spec.processor.function: module {module_name!r} has no attribute {attr!r}"
            )
        target = getattr(target, part)
    if not callable(target):
        raise FunctionLoadError(f"spec.processor.function: {path!r} is not callable")
    return target  # type: ignore[no-any-return]


def values_of(result: Any) -> list[Any]:
    """The function's return value as a list: None drops, a list fans out, else one value."""
    if result is None:
        return []
    if isinstance(result, list):
        return result
    return [result]


class FunctionProcessor(Processor):
    """Calls the user's function on each record; an exception fails that record only."""

    def __init__(self, function: ProcessFunction) -> None:
        self.function = function

    def process(self, records: Sequence[Record]) -> list[Outcome]:
        out: list[Outcome] = []
        append, function, new_outcome = out.append, self.function, tuple.__new__
        for record in records:
            try:
                result = function(record)
            except Exception as exc:  # user code: any exception is that record's failure
                append(Outcome([], exc))
                continue
            # values_of() and Outcome(...), inlined: this runs once per record, and a
            # NamedTuple's __new__ is a Python call that costs more than the tuple it makes.
            if result is None:
                append(new_outcome(Outcome, ([], None, True)))
            elif isinstance(result, list):
                append(new_outcome(Outcome, (result, None, True)))
            else:
                append(new_outcome(Outcome, ([result], None, True)))
        return out


ProcessBatchFunction = Callable[[list[Record]], Any]


class BatchFunctionProcessor(Processor):
    """Calls the user's function on a list of records; per-record failures stay per record.

    An exception *instance* among the results fails that record alone. An exception raised
    by the call fails no one yet: the function is called again on each record alone, so that
    only the records that fail on their own are retried or dead-lettered, not their batch.
    """

    def __init__(self, function: ProcessBatchFunction, name: str = "processor.function") -> None:
        self.function = function
        self.name = name

    def process(self, records: Sequence[Record]) -> list[Outcome]:
        batch = list(records)
        try:
            results = self.function(batch)
        except Backpressure as exc:  # "slow down" holds the whole call's records
            return [Outcome([], exc)] * len(batch)
        except Exception as exc:  # user code: find the records that fail, one by one
            if len(batch) == 1:
                return [Outcome([], exc)]
            return [self.process([r])[0] for r in batch]
        if not isinstance(results, list) or len(results) != len(batch):
            got = f"{len(results)} results" if isinstance(results, list) else type(results).__name__
            error = ValueError(
                f"{self.name} (batch: true) must return a list with one result per record: "
                f"got {got} for {len(batch)} record(s)"
            )
            return [Outcome([], error)] * len(batch)
        return [
            Outcome([], r) if isinstance(r, Exception) else Outcome(values_of(r)) for r in results
        ]


class PassThrough(Processor):
    """No processor configured: every record goes on unchanged."""

    def process(self, records: Sequence[Record]) -> list[Outcome]:
        return [Outcome([r.value]) for r in records]
