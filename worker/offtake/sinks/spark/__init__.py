"""The Spark batch sink (``sink.spark``): bounded batches written by PySpark jobs.

The engine calls :func:`make_spark_sink` when ``spec.sink.spark`` is set. The sink's modules
are loaded on first use: the operator imports ``offtake.sinks.spark.kubernetes`` (the
SparkConnect it renders) without pyarrow and pyspark, which only the worker-spark image has.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from offtake.sinks.spark.batching import Batch, Batcher, BatchId
    from offtake.sinks.spark.sink import SparkSink, make_spark_sink

__all__ = ["Batch", "BatchId", "Batcher", "SparkSink", "make_spark_sink"]

_HOME = {
    "Batch": "batching",
    "BatchId": "batching",
    "Batcher": "batching",
    "SparkSink": "sink",
    "make_spark_sink": "sink",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
