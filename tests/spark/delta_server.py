"""A Spark Connect server able to write Delta, for the delta sink's test.

Delta releases are built for one Spark minor version, and the newest delta-spark_2.13 (4.4.0)
targets Spark 4.2: on Spark 4.3 its replaceWhere path fails with NoSuchMethodError. So the
test runs Delta where users would run it at scale, on a Spark Connect server, using Spark 4.2
from the pyspark 4.2.0 source distribution (fetched once with pip download, unpacked in the
Offtake cache) and delta-spark from Maven Central. The worker stays on the installed pyspark.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

from offtake.sinks.spark.cache import ivy_dir
from offtake.sinks.spark.session import DELTA_CONF

from .connect_server import ConnectServer

SPARK_FOR_DELTA = "4.2.0"
DELTA_PACKAGE = "io.delta:delta-spark_2.13:4.4.0"


def _cache() -> Path:
    return Path(os.environ.get("OFFTAKE_CACHE", Path.home() / ".cache" / "offtake"))


def spark_home(version: str = SPARK_FOR_DELTA) -> Path:
    """SPARK_HOME of a pyspark ``version`` unpacked in the cache (downloading it once)."""
    home = _cache() / "spark" / f"pyspark-{version}" / "deps"
    if (home / "bin" / "spark-submit").exists():
        return home
    wheels = _cache() / "wheels"
    sdist = wheels / f"pyspark-{version}.tar.gz"
    if not sdist.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"pyspark=={version}",
                "-d",
                str(wheels),
            ],
            check=True,
            capture_output=True,
        )
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(f"pyspark-{version}/deps/")]
        tar.extractall(_cache() / "spark", members=members, filter="tar")
    for script in (home / "bin").iterdir():
        script.chmod(0o755)
    return home


def delta_connect_server() -> ConnectServer:
    conf = {
        **DELTA_CONF,
        "spark.jars.ivy": str(ivy_dir()),
        # Two cores here: Delta's defaults (50 snapshot partitions, 200 shuffle partitions)
        # schedule hundreds of near-empty tasks per commit.
        "spark.sql.shuffle.partitions": "2",
        "spark.databricks.delta.snapshotPartitions": "2",
    }
    return ConnectServer(master="local[2]", home=spark_home(), packages=(DELTA_PACKAGE,), conf=conf)
