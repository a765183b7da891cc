"""Runs a SparkSink in connect mode in its own process, as a worker without a JVM would.

(A Spark Connect session switches the whole process's pyspark into Connect mode, so it cannot
share a process with the tests' local session.) Usage: python -m tests.spark.connect_job JSON
where JSON has spark (the sink.spark fields), partition, start, stop. Prints a JSON summary.
``--read URL FORMAT PATH`` prints the table's [partition, offset] pairs instead.
"""

from __future__ import annotations

import json
import sys
import time

from offtake.metrics import Metrics
from offtake.sinks.base import SinkBatch
from offtake.sinks.spark import SparkSink
from offtake.sinks.spark.session import is_remote

from .support import Collector, items, pipeline


def read_offsets(url: str, fmt: str, path: str) -> None:
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(url).getOrCreate()
    rows = session.read.format(fmt).load(path).select("partition", "offset").collect()
    print(json.dumps(sorted([r["partition"], r["offset"]] for r in rows)))


def main() -> None:
    if sys.argv[1] == "--read":
        read_offsets(*sys.argv[2:5])
        return
    args = json.loads(sys.argv[1])
    spec = pipeline(args["spark"])
    sink = SparkSink(spec, Metrics("connect-test"))
    done = Collector()
    sink.start(done)
    recs = items(range(args["start"], args["stop"]), partition=args.get("partition", 0))
    for it in recs:
        sink.submit(SinkBatch.of([it]))
    deadline = time.monotonic() + 300
    while done.count < len(recs) and time.monotonic() < deadline:
        sink.drain(None, 1.0)
    remote = is_remote(sink._session)
    sink.close()
    errors = sorted({str(e) for _, e in done.failed})
    print(
        json.dumps(
            {
                "ok": len(done.ok),
                "failed": len(done.failed),
                "errors": errors,
                "remote": remote,
                "jvm": "py4j.java_gateway" in sys.modules and _has_gateway(),
            }
        )
    )


def _has_gateway() -> bool:
    from pyspark import SparkContext

    return SparkContext._gateway is not None


if __name__ == "__main__":
    main()
