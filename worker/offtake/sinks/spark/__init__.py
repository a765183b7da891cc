"""The Spark batch sink (``sink.spark``): bounded batches written by PySpark jobs.

The engine calls :func:`make_spark_sink` when ``spec.sink.spark`` is set.
"""

from offtake.sinks.spark.batching import Batch, Batcher, BatchId
from offtake.sinks.spark.sink import SparkSink, make_spark_sink

__all__ = ["Batch", "BatchId", "Batcher", "SparkSink", "make_spark_sink"]
