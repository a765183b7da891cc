"""A class-data archive for the worker's local Spark JVM: Spark starts in about half the time.

Before a local session is ready its JVM loads and verifies several thousand classes from
Spark's jars, and about as many again in the first job; on a busy two-core pod that is most
of the seconds before the first batch is written. Java's dynamic class-data sharing (AppCDS,
JDK 13 and later) keeps those classes, parsed and verified, in an archive file that a later
JVM maps instead of loading them again. Measured on the development machine (2 cores), one
session and three jobs of 100,000 rows: session start 5.6 s without the archive, 3.6 s with
it; the first job 5.2 s and 3.3 s; later jobs unchanged (docs/spark-sink.md, "JVM start").

The archive is made once by a short training run, ``offtake spark-archive``
(archive_training.py; this module, a leaf that session.py imports, only finds it): a local
session writes a small table through the sink's own file writer, and its JVM writes out the
classes it loaded as it exits (``-XX:ArchiveClassesAtExit``). Every later local session maps
it through ``spark.driver.defaultJavaOptions`` (``-XX:SharedArchiveFile``), which leaves
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
import shutil
from pathlib import Path

from offtake import environment
from offtake.sinks.spark.cache import cache_root

ARCHIVES_ENV = environment.SPARK_ARCHIVES_ENV


def archive_dir() -> Path:
    explicit = environment.value(ARCHIVES_ENV)
    if explicit:
        return Path(explicit)
    return cache_root() / "spark-archives"


def java_binary() -> Path | None:
    """The java that Spark's launcher runs: ``$JAVA_HOME/bin/java``, else java on PATH."""
    home = environment.java_home()
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
