"""Every Spark package set Offtake uses resolves from Maven Central alone (issue 41).

Spark's built-in Ivy settings fall back to repos.spark-packages.org, and Ivy asks that
fallback for jars of POM-only artifacts (net.java:jvnet-parent:3, a parent of jts), so a
machine that cannot reach it failed to resolve delta-spark. Each set here is resolved the way
Spark resolves it (spark-submit --packages with the project's ivysettings.xml) into an empty
Ivy folder of its own under tmp_path, never the warm caches, so a missing or POM-only artifact
fails here naming it. Needs Maven Central, as scripts/setup.sh does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from offtake.sinks.spark.cache import ivy_settings
from offtake.sinks.spark.session import base_conf, session_config

from .connect_server import spark_home
from .delta_server import DELTA_PACKAGE
from .delta_server import spark_home as delta_spark_home
from .support import pipeline


def _worker_packages(sink: dict[str, object]) -> tuple[str, ...]:
    return session_config(pipeline(sink).sink.spark).packages  # type: ignore[union-attr]


JDBC = {"url": "jdbc:postgresql://db:5432/lake", "table": "orders", "user": "u"}
# jts-core, whose parent POMs (org.locationtech.jts:jts, net.java:jvnet-parent) are POM-only:
# the artifact issue 41 failed on, so the delta sets show that path was taken.
JTS = ("org.locationtech.jts_jts-core-",)
# (name, SPARK_HOME, packages, jar prefixes expected among the dependencies): the worker's
# sessions per format that brings packages (local, with the installed pyspark), and the test
# bed's Delta Connect server (Spark 4.2).
PACKAGE_SETS = [
    ("worker-delta", spark_home, _worker_packages({"format": "delta", "path": "/lake"}), JTS),
    (
        "worker-jdbc-postgresql",
        spark_home,
        _worker_packages({"format": "jdbc", "jdbc": JDBC}),
        (),
    ),
    ("connect-server-delta", delta_spark_home, (DELTA_PACKAGE,), JTS),
]


def test_the_worker_and_the_test_bed_resolve_with_the_maven_central_settings() -> None:
    assert base_conf()["spark.jars.ivySettings"] == str(ivy_settings())
    settings = ivy_settings().read_text()
    assert "https://repo1.maven.org/maven2/" in settings
    assert "spark-packages" not in settings.split("-->")[-1]  # only the comment names it


def _failures(log: str) -> list[str]:
    """Ivy's lines naming what it could not resolve or download."""
    marks = ("UNRESOLVED", "FAILED", "NOT FOUND", "not found", "unresolved dependency", ":: ")
    return [line.strip() for line in log.splitlines() if any(m in line for m in marks)]


@pytest.mark.parametrize(
    ("home", "packages", "dependencies"),
    [pytest.param(*rest, id=name) for name, *rest in PACKAGE_SETS],
)
def test_package_set_resolves_from_maven_central_into_an_empty_ivy_folder(
    home: object, packages: tuple[str, ...], dependencies: tuple[str, ...], tmp_path: Path
) -> None:
    assert packages, "a package set without packages checks nothing"
    spark = Path(home())  # type: ignore[operator]
    ivy = tmp_path / "ivy"
    ivy.mkdir()
    noop = tmp_path / "noop.py"
    noop.write_text("")  # spark-submit resolves --packages before it runs the application
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONF_DIR")}
    env.update(SPARK_HOME=str(spark), PYSPARK_PYTHON=sys.executable)
    cmd = [
        str(spark / "bin" / "spark-submit"),
        "--master",
        "local[1]",
        "--conf",
        f"spark.jars.ivy={ivy}",
        "--conf",
        f"spark.jars.ivySettings={ivy_settings()}",
        "--conf",
        "spark.ui.enabled=false",
        "--packages",
        ",".join(packages),
        str(noop),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"{','.join(packages)} did not resolve from Maven Central:\n" + (
        "\n".join(_failures(log)) or log[-4000:]
    )
    # Spark's own settings ask the fallback for every parent POM's jar (measured on this
    # machine: 34 "Host repos.spark-packages.org not found" lines for delta-spark 4.4.0).
    asked = [line.strip() for line in log.splitlines() if "repos.spark-packages.org" in line]
    assert not asked, "Ivy went past Maven Central:\n" + "\n".join(asked[:5])
    jars = {p.name for p in (ivy / "jars").glob("*.jar")}
    for coordinate in packages:
        group, artifact, version = coordinate.split(":")
        assert f"{group}_{artifact}-{version}.jar" in jars, f"{coordinate}: no jar in {ivy}"
    for prefix in dependencies:
        assert any(j.startswith(prefix) for j in jars), f"{prefix}*.jar: not among {sorted(jars)}"
