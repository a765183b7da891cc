"""The training run that makes the class-data archive of class_archive.py: a local session
writes a small table through the sink's own file writer, and its JVM writes out the classes it
loaded as it exits (``-XX:ArchiveClassesAtExit``). Run by ``offtake spark-archive``.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from offtake.errors import OfftakeError
from offtake.sinks.spark.batching import BatchId
from offtake.sinks.spark.class_archive import archive_path
from offtake.sinks.spark.fileops import HadoopFileOps
from offtake.sinks.spark.session import SessionConfig, base_conf, create_session
from offtake.sinks.spark.writers import BATCH_COLUMN, FileWriter

log = logging.getLogger(__name__)

# How long the training JVM may take to exit, writing the archive (~170 MB) as it does.
EXIT_SECONDS = 180.0


class ArchiveError(OfftakeError):
    """The training run did not leave an archive; the message says why."""


def make_archive(directory: Path | None = None, *, force: bool = False) -> Path:
    """Run the training session in this process and keep its JVM's archive (unless one for
    this JVM and Spark is there already and not ``force``).

    Call it in a process without a Spark session of its own (``offtake spark-archive``): the
    JVM writes the archive as it exits, so this process starts that JVM and waits for its end.
    Blocks for tens of seconds. The archive appears under its name whole or not at all.
    """
    target = archive_path(directory)
    if target is None:
        raise ArchiveError("no java (JAVA_HOME or PATH) or no pyspark: nothing to archive")
    if target.is_file() and not force:
        log.info("class-data archive for Spark found: %s", target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    session = _training_session(partial)
    jvm = session.sparkContext._gateway.proc
    try:
        _train(session)
    finally:
        session.stop()
        # The JVM exits when its stdin closes (pyspark's gateway contract); then it writes.
        jvm.stdin.close()
        code = jvm.wait(EXIT_SECONDS)
    if not partial.is_file() or partial.stat().st_size == 0:
        raise ArchiveError(f"the training JVM exited {code} without writing {partial}")
    os.replace(partial, target)
    log.info("class-data archive for Spark written: %s", target)
    return target


def _training_session(partial: Path) -> Any:
    conf = {
        **base_conf(),
        # The JVM warns of each class it cannot archive (old bytecode, signed jars): not news.
        "spark.driver.defaultJavaOptions": f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds*=error",
    }
    return create_session(
        SessionConfig("local", "local[2]", None, "offtake-spark-archive", (), conf)
    )


def _train(session: Any) -> None:
    """Load what a batch loads: Arrow in, the shared job's partitioned write, the moves into
    place, a JSON write, and the footer reads of the typed columns' seeding."""
    import pyarrow as pa

    # Enough rows that the job takes the paths a real batch takes (several Arrow batches per
    # task, more than one file per partition folder): a toy table leaves a second of class
    # loading to the first real job.
    rows, parts = 20_000, 4
    table = pa.table(
        {
            "topic": pa.array(["t"] * rows, pa.string()),
            "partition": pa.array([i % parts for i in range(rows)], pa.int32()),
            "offset": pa.array(range(rows), pa.int64()),
            "timestamp": pa.array(
                [1_700_000_000_000 + i for i in range(rows)], pa.timestamp("ms", tz="UTC")
            ),
            "key": pa.array([str(i).encode() for i in range(rows)], pa.binary()),
            "id": pa.array(range(rows), pa.int64()),
            "customer": pa.array([f"c{i % 97}" for i in range(rows)], pa.string()),
            "amount": pa.array([i * 0.5 for i in range(rows)], pa.float64()),
            "ok": pa.array([i % 3 == 0 for i in range(rows)], pa.bool_()),
            "tags": pa.array([["a", "b"]] * rows, pa.list_(pa.string())),
            "nested": pa.array([{"x": i, "y": "z"} for i in range(rows)]),
            BATCH_COLUMN: pa.array([i % parts for i in range(rows)], pa.int32()),
        }
    )
    batches = [BatchId("t", p, p, rows - parts + p) for p in range(parts)]
    with tempfile.TemporaryDirectory(prefix="offtake-spark-archive-") as work:
        fs = HadoopFileOps(session)
        for fmt in ("parquet", "json"):
            path = str(Path(work) / fmt)
            writer = FileWriter(fmt, path, (), fs)
            for _ in range(2):  # the second write replaces the first: the deletes load too
                writer.write_batches(session.createDataFrame(table), batches, lambda _b: True)
            session.read.format(fmt).load(path).count()
