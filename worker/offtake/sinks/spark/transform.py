"""The optional transform a batch passes through inside Spark, before it is written.

``transform: module:callable`` names a function DataFrame -> DataFrame importable in the worker
image; ``sql:`` is a query over the batch, registered as the temporary view ``batch``. Both run
in Spark (classic or Connect), so the same function scales out unchanged.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from offtake.errors import OfftakeError

BATCH_VIEW = "batch"

DataFrameFn = Callable[[Any], Any]


class TransformError(OfftakeError):
    """The transform could not be loaded, or did not return a DataFrame."""


def load_transform(ref: str) -> DataFrameFn:
    """Import ``module:callable``; the error names the field and what is wrong."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise TransformError(f"sink.spark.transform: {ref!r} is not of the form module:callable")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TransformError(f"sink.spark.transform: cannot import {module_name!r}: {exc}") from exc
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise TransformError(
                f"sink.spark.transform: {module_name!r} has no attribute {attr!r}"
            ) from None
    if not callable(target):
        raise TransformError(f"sink.spark.transform: {ref!r} is not callable")
    fn: DataFrameFn = target
    return fn


def make_transform(function: str | None, sql: str | None) -> DataFrameFn | None:
    """The transform the spec asks for (function first, then SQL), or None."""
    steps: list[DataFrameFn] = []
    if function:
        steps.append(_checked(load_transform(function), function))
    if sql:
        steps.append(_sql_step(sql))
    if not steps:
        return None

    def run(df: Any) -> Any:
        for step in steps:
            df = step(df)
        return df

    return run


def _checked(fn: DataFrameFn, ref: str) -> DataFrameFn:
    def run(df: Any) -> Any:
        out = fn(df)
        if not _is_dataframe(out):
            raise TransformError(
                f"sink.spark.transform: {ref} returned {type(out).__name__}, not a DataFrame"
            )
        return out

    return run


def _sql_step(sql: str) -> DataFrameFn:
    def run(df: Any) -> Any:
        df.createOrReplaceTempView(BATCH_VIEW)
        return df.sparkSession.sql(sql)

    return run


def _is_dataframe(obj: Any) -> bool:
    # Classic and Connect DataFrames are different classes; both have these.
    return hasattr(obj, "schema") and hasattr(obj, "write") and hasattr(obj, "columns")
