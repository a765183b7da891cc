"""A class-data archive for the worker's local Spark JVM: Spark starts in about half the time.

Before a local session is ready its JVM loads and verifies several thousand classes from
Spark's jars, and about as many again in the first job; on a busy two-core pod that is most
of the seconds before the first batch is written. Java's dynamic class-data sharing (AppCDS,
JDK 13 and later) keeps those classes, parsed and verified, in an archive file that a later
JVM maps instead of loading them again. Measured on the development machine (2 cores), one
session and three jobs of 100,000 rows: session start 5.6 s without the archive, 3.6 s with
it; the first job 5.2 s and 3.3 s; later jobs unchanged (docs/spark-sink.md, "JVM start").

The archive is made once by a short training run, ``offtake spark-archive``: a local session
writes a small table through the sink's own file writer, and its JVM writes out the classes it
loaded as it exits (``-XX:ArchiveClassesAtExit``). Every later local session maps it through
``spark.driver.defaultJavaOptions`` (``-XX:SharedArchiveFile``), which leaves
``spark.driver.extraJavaOptions`` to the user. An archive is valid for one JVM and one set of
Spark jars: its name carries both, and a JVM that finds an archive not its own maps nothing
and starts as it would have without one (``-Xshare:auto``, Java's default). Without an
archive nothing changes. Only mode ``local`` starts a JVM in the worker; Connect and
kubernetes modes have none to speed up.

The archives live in ``$OFFTAKE_SPARK_ARCHIVES``, else ``$OFFTAKE_CACHE/spark-archives``
(``~/.cache/offtake/spark-archives``). The worker-spark image makes one at build time, in a
folder it names with that variable.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from offtake.sinks.spark.session import SessionConfig, base_conf, cache_root, create_session

log = logging.getLogger(__name__)

ARCHIVES_ENV = "OFFTAKE_SPARK_ARCHIVES"
# How long the training JVM may take to exit, writing the archive (~170 MB) as it does.
EXIT_SECONDS = 180.0


class ArchiveError(Exception):
    """The training run did not leave an archive; the message says why."""


def archive_dir() -> Path:
    explicit = os.environ.get(ARCHIVES_ENV)
    if explicit:
        return Path(explicit)
    return cache_root() / "spark-archives"


def java_binary() -> Path | None:
    """The java that Spark's launcher runs: ``$JAVA_HOME/bin/java``, else java on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if found is None or not Path(found).exists():
        return None
    return Path(found).resolve()


def archive_path(directory: Path | None = None) -> Path | None:
    """Where the archive of this JVM and this pyspark's jars is (or would be); None without
    java or pyspark."""
    java = java_binary()
    try:
        import pyspark
    except ImportError:
        return None
    if java is None:
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    stamp = f"{java}:{java.stat().st_mtime_ns}:{jars.resolve()}"
    digest = hashlib.sha256(stamp.encode()).hexdigest()[:12]
    return (directory or archive_dir()) / f"spark-{pyspark.__version__}-{digest}.jsa"


def java_options() -> str | None:
    """The driver option that maps the archive, if there is one for this JVM and Spark."""
    path = archive_path()
    if path is None or not path.is_file():
        return None
    return f"-XX:SharedArchiveFile={path}"


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

    from offtake.sinks.spark.batching import BatchId
    from offtake.sinks.spark.fileops import HadoopFileOps
    from offtake.sinks.spark.writers import BATCH_COLUMN, FileWriter

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
