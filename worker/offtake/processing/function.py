"""In-process processing: a Python function ``module:callable`` called once per record."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

from offtake.processing.base import Outcome, Processor
from offtake.records import Record

ProcessFunction = Callable[[Record], Any]


class FunctionLoadError(ValueError):
    """processor.function does not name an importable callable."""


def load_function(path: str) -> ProcessFunction:
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
        for record in records:
            try:
                out.append(Outcome(values_of(self.function(record))))
            except Exception as exc:  # user code: any exception is that record's failure
                out.append(Outcome([], exc))
        return out


class PassThrough(Processor):
    """No processor configured: every record goes on unchanged."""

    def process(self, records: Sequence[Record]) -> list[Outcome]:
        return [Outcome([r.value]) for r in records]
