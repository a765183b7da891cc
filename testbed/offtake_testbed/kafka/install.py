"""Installing Kafka for the test bed: Maven resolves ``kafka_2.13`` and its runtime
dependencies from Maven Central into ``cache_dir("kafka", <version>, "libs")`` once."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import IO

from .._cache import Progress, cache_dir, folder_size, megabytes
from ..maven import maven_errors, run_maven
from ..process import file_lock

__all__ = ["KAFKA_VERSION", "KafkaTestbedError", "install_kafka"]

# 4.3.x is a patch-released line of Kafka 4 (KRaft only, log4j2, broker on Java 17).
KAFKA_VERSION = "4.3.1"

# Kafka's pom declares no logging backend (the binary distribution ships one in libs/); these
# are the same log4j2 jars, bound to the slf4j 1.7 API that kafka_2.13 depends on.
_LOG4J_VERSION = "2.24.3"
# Pinned because Maven 3.8's built-in default for this plugin is too old to be reliable.
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_MARKER = ".offtake-installed"
_MVN_TIMEOUT_S = 900.0


class KafkaTestbedError(RuntimeError):
    """Installing or running the test broker failed; the message says why and what to do."""


def install_kafka(version: str = KAFKA_VERSION, *, progress: IO[str] | None = None) -> Path:
    """Resolve Kafka ``version`` and its runtime jars into the cache; return the libs folder.

    Idempotent and cheap when already done: a marker file written after a complete download is
    all that is checked. Progress lines go to ``progress`` (e.g. ``sys.stderr``) if given.
    """
    say = Progress("kafka", progress)
    version_dir = cache_dir("kafka", version)
    libs = version_dir / "libs"
    if _is_installed(version_dir, libs):
        say.cached(f"Kafka {version} ({_jars_summary(libs)})", libs)
        return libs
    # A file lock, because parallel test processes may all try to install on a cold cache.
    with file_lock(version_dir / ".install.lock"):
        if _is_installed(version_dir, libs):
            say.cached(f"Kafka {version} ({_jars_summary(libs)})", libs)
            return libs
        started = time.monotonic()
        _resolve_with_maven(version, version_dir, libs, say)
        say.say(
            f"Kafka {version}: {_jars_summary(libs)} in {libs}, "
            f"fetched in {time.monotonic() - started:.1f} s"
        )
    return libs


def _jars_summary(libs: Path) -> str:
    count, size = folder_size(libs)
    return f"{count} jars, {megabytes(size)}"


def _is_installed(version_dir: Path, libs: Path) -> bool:
    return (version_dir / _MARKER).is_file() and libs.is_dir()


def _resolve_with_maven(version: str, version_dir: Path, libs: Path, say: Progress) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaTestbedError("mvn not found on PATH: Maven 3.6+ is needed to fetch Kafka jars")
    with tempfile.TemporaryDirectory(prefix="mvn-", dir=version_dir) as work:
        staging = Path(work) / "libs"
        (Path(work) / "pom.xml").write_text(_pom(version))
        _run_maven(mvn, Path(work), staging, version, say)
        if not (staging / f"kafka_2.13-{version}.jar").is_file():
            raise KafkaTestbedError(f"Maven finished but kafka_2.13-{version}.jar is missing")
        # Swap in the complete folder only now, so a crash never leaves a half-filled libs/.
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
    (version_dir / _MARKER).write_text(f"kafka_2.13 {version}\n")


def _run_maven(mvn: str, work: Path, output: Path, version: str, say: Progress) -> None:
    command = [
        mvn,
        "-B",
        "-U",  # retry artifacts whose earlier failure (e.g. no network) Maven has cached
        "-Dstyle.color=never",
        # Keep Maven's local repository inside the Offtake cache, like every other download.
        f"-Dmaven.repo.local={cache_dir('maven', 'repository')}",
        f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={output}",
    ]
    say.say(
        f"resolving org.apache.kafka:kafka_2.13:{version} and its runtime jars from Maven "
        "Central (a cold cache downloads about 60 MB, including Maven's own plugins)"
    )
    code, log = run_maven(command, work, say, _MVN_TIMEOUT_S)
    if code is None:
        raise KafkaTestbedError(
            f"Maven did not finish resolving Kafka {version} within {_MVN_TIMEOUT_S:.0f}s"
        )
    if code != 0:
        tail = maven_errors(log)
        raise KafkaTestbedError(
            f"could not resolve org.apache.kafka:kafka_2.13:{version} from Maven Central:\n{tail}"
        )


def _pom(version: str) -> str:
    deps = [
        ("org.apache.kafka", "kafka_2.13", version),
        ("org.apache.logging.log4j", "log4j-core", _LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", _LOG4J_VERSION),
    ]
    xml = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.offtake.testbed</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
{xml}
  </dependencies>
</project>
"""
