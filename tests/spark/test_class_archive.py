"""The class-data archive of local Spark sessions (offtake.sinks.spark.class_archive):
``offtake spark-archive`` makes one, a local session maps it (its classes come from the shared
file, not the jars), other modes and the user's own Java options are left alone, and a broken
or missing archive only costs the speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from offtake.sinks.spark.class_archive import ARCHIVES_ENV, archive_path
from offtake.sinks.spark.session import session_config

from .support import pipeline

DEFAULT_OPTIONS = "spark.driver.defaultJavaOptions"

# A local session in its own process (one JVM per process): prints what the driver's Spark
# conf holds for DEFAULT_OPTIONS, with each class load logged to argv[2] by the JVM.
SESSION_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from support import pipeline
    from offtake.sinks.spark.session import create_session, session_config
    spec = pipeline({"format": "parquet", "path": "/tmp/unused", "submit": {
        "master": "local[1]",
        "conf": {"spark.driver.extraJavaOptions": "-Xlog:class+load=info:file=" + sys.argv[2]},
    }})
    session = create_session(session_config(spec.sink.spark))
    print(json.dumps(session.sparkContext.getConf().get("spark.driver.defaultJavaOptions")))
    session.stop()
    """
)


def _env(archives: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "SPARK_REMOTE")}
    env[ARCHIVES_ENV] = str(archives)
    return env


def _spark_archive(
    env: dict[str, str], cwd: Path, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``offtake spark-archive ARGS`` in its own process (the JVM it starts must exit)."""
    return subprocess.run(
        [sys.executable, "-m", "offtake.cli", "spark-archive", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def _local_session(archives: Path, tmp_path: Path) -> tuple[str | None, str]:
    """(the session's default Java options, the JVM's class-load log) of a local session."""
    loads = tmp_path / "class-load.log"
    script = tmp_path / "session.py"
    script.write_text(SESSION_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(Path(__file__).parent), str(loads)],
        env=_env(archives),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    options = json.loads(done.stdout.strip().splitlines()[-1])
    return options, loads.read_text()


def test_spark_archive_makes_an_archive_a_local_session_loads_spark_from(tmp_path: Path) -> None:
    archives = tmp_path / "archives"
    made = _spark_archive(_env(archives), tmp_path, "--dir", str(archives))
    assert made.returncode == 0, made.stderr[-3000:]
    path = Path(made.stdout.strip().splitlines()[-1])
    assert path == archive_path(archives)
    assert path.is_file() and path.stat().st_size > 10_000_000
    assert not [p.name for p in archives.iterdir() if p != path], "no partial file is left"

    options, loads = _local_session(archives, tmp_path)
    assert options == f"-XX:SharedArchiveFile={path}"
    spark_context = [ln for ln in loads.splitlines() if " org.apache.spark.SparkContext " in ln]
    assert spark_context and "shared objects file (top)" in spark_context[0], spark_context
    shared = sum("shared objects file (top)" in ln for ln in loads.splitlines())
    assert shared > 3000, f"only {shared} classes came from the archive"

    # Once made, it is kept: a second run finds it instead of training again.
    again = _spark_archive(_env(archives), tmp_path, "--dir", str(archives), timeout=60)
    assert again.returncode == 0 and "found" in again.stderr, again.stderr[-2000:]
    assert again.stdout.strip().splitlines()[-1] == str(path)


def test_an_archive_not_made_by_this_jvm_costs_only_the_speed(tmp_path: Path) -> None:
    archives = tmp_path / "archives"
    path = archive_path(archives)
    assert path is not None
    archives.mkdir()
    path.write_bytes(os.urandom(1 << 16))  # what a JVM from another build would find
    options, loads = _local_session(archives, tmp_path)
    assert options == f"-XX:SharedArchiveFile={path}"
    assert "org.apache.spark.SparkContext source: jar:" in loads or (
        "org.apache.spark.SparkContext source: file:" in loads
    )


def test_only_local_sessions_map_it_and_the_users_options_stay_theirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ARCHIVES_ENV, str(tmp_path))
    local = pipeline({"format": "parquet", "path": "/tmp/x"}).sink.spark
    assert local is not None
    assert DEFAULT_OPTIONS not in session_config(local).conf, "no archive, no option"

    path = archive_path(tmp_path)
    assert path is not None
    path.write_bytes(b"made by offtake spark-archive")
    assert session_config(local).conf[DEFAULT_OPTIONS] == f"-XX:SharedArchiveFile={path}"

    mine = "-Xshare:off"
    own = pipeline(
        {
            "format": "parquet",
            "path": "/tmp/x",
            "submit": {"conf": {DEFAULT_OPTIONS: mine, "spark.driver.extraJavaOptions": "-Dx=1"}},
        }
    ).sink.spark
    assert own is not None
    conf = session_config(own).conf
    assert conf[DEFAULT_OPTIONS] == mine and conf["spark.driver.extraJavaOptions"] == "-Dx=1"

    remote = pipeline(
        {
            "format": "parquet",
            "path": "/tmp/x",
            "submit": {"mode": "connect", "connectUrl": "sc://h"},
        }
    ).sink.spark
    assert remote is not None
    assert DEFAULT_OPTIONS not in session_config(remote).conf, "no JVM of ours to map it into"


def test_spark_archive_without_java_says_so(tmp_path: Path) -> None:
    env = {**_env(tmp_path), "JAVA_HOME": str(tmp_path / "no-jdk")}
    done = _spark_archive(env, tmp_path, timeout=60)
    assert done.returncode == 3
    assert "offtake spark-archive: no java (JAVA_HOME or PATH)" in done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.glob("*.jsa")) == []
