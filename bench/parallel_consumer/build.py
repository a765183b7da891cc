"""Confluent's Parallel Consumer for bench/concurrency.py: ParallelConsumerBench.java (beside
this file) compiled against io.confluent.parallelconsumer:parallel-consumer-core from Maven
Central, with Maven, the way the test bed builds Apicurio Registry: a generated pom, Central
only, the test bed's Maven repository in the cache. The classes and their runtime jars go to
``$OFFTAKE_CACHE/bench-build/parallel-consumer-<version>-<digest>/`` (the digest of the Java
source and the pom), once; nothing built is committed.

    python bench/parallel_consumer/build.py     # build (or find) it, print the java command
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

from offtake_testbed._cache import Progress, cache_dir
from offtake_testbed.maven import find_java, maven_errors, run_maven

PARALLEL_CONSUMER_VERSION = "0.5.3.3"
# slf4j's simple backend, the version the Parallel Consumer is built against (its parent
# pom's slf4j.version): its warnings and errors on stderr, into the contender's log.
SLF4J_VERSION = "2.0.13"
MAIN_CLASS = "dev.offtake.bench.ParallelConsumerBench"
SOURCE = Path(__file__).resolve().parent / "ParallelConsumerBench.java"
_MVN_TIMEOUT_S = 900.0
_MARKER = ".offtake-built"


class BuildError(RuntimeError):
    """The Parallel Consumer bench could not be built here; the message says why."""


def _pom(version: str) -> str:
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.offtake.bench</groupId>
  <artifactId>parallel-consumer-bench</artifactId>
  <version>1</version>
  <packaging>jar</packaging>
  <properties>
    <maven.compiler.release>17</maven.compiler.release>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
  </properties>
  <dependencies>
    <dependency>
      <groupId>io.confluent.parallelconsumer</groupId>
      <artifactId>parallel-consumer-core</artifactId>
      <version>{version}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-simple</artifactId>
      <version>{SLF4J_VERSION}</version>
    </dependency>
  </dependencies>
  <build>
    <plugins>
      <!-- Maven's default compiler plugin (3.1) predates maven.compiler.release. -->
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-compiler-plugin</artifactId>
        <version>3.13.0</version>
      </plugin>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-dependency-plugin</artifactId>
        <version>3.8.1</version>
      </plugin>
    </plugins>
  </build>
</project>
"""


_SETTINGS = """<settings>
  <mirrors>
    <mirror><id>central-only</id><mirrorOf>*</mirrorOf><url>https://repo.maven.apache.org/maven2</url></mirror>
  </mirrors>
</settings>
"""


def install(version: str = PARALLEL_CONSUMER_VERSION, progress: bool = True) -> Path:
    """The built folder (``classes/`` and ``lib/``), built once."""
    say = Progress("parallel-consumer", sys.stderr if progress else None)
    pom = _pom(version)
    digest = hashlib.sha256(SOURCE.read_bytes() + pom.encode()).hexdigest()[:12]
    home = cache_dir("bench-build") / f"parallel-consumer-{version}-{digest}"
    if (home / _MARKER).is_file():
        say.cached(f"Parallel Consumer {version} bench", home)
        return home
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BuildError("mvn not found on PATH: Maven builds the Parallel Consumer bench")
    build = home.with_name(home.name + ".build")
    shutil.rmtree(build, ignore_errors=True)
    java_dir = build / "src" / "main" / "java" / "dev" / "offtake" / "bench"
    java_dir.mkdir(parents=True)
    shutil.copy2(SOURCE, java_dir / SOURCE.name)
    (build / "pom.xml").write_text(pom)
    (build / "settings.xml").write_text(_SETTINGS)
    command = [
        mvn,
        "-B",
        "-Dstyle.color=never",
        "-s",
        str(build / "settings.xml"),
        f"-Dmaven.repo.local={cache_dir('maven', 'repository')}",
        "-DincludeScope=runtime",
        "-DoutputDirectory=target/lib",
        "package",
        "dependency:copy-dependencies",
    ]
    say.say(f"building the Parallel Consumer {version} bench with Maven (once)")
    code, output = run_maven(command, build, say, _MVN_TIMEOUT_S)
    if code is None:
        raise BuildError(f"Maven did not build the Parallel Consumer bench in {_MVN_TIMEOUT_S}s")
    if code != 0:
        raise BuildError(f"building the Parallel Consumer bench failed:\n{maven_errors(output)}")
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    shutil.copytree(build / "target" / "classes", home / "classes")
    shutil.copytree(build / "target" / "lib", home / "lib")
    shutil.rmtree(build, ignore_errors=True)
    (home / _MARKER).write_text(f"parallel-consumer-core {version}\n")
    say.say(f"built into {home}")
    return home


def command(home: Path) -> list[str]:
    """``java ... MainClass``: append the bench's arguments."""
    java = find_java(BuildError)
    classpath = f"{home / 'classes'}:{home / 'lib'}/*"
    # A small heap, as a sidecar-sized JVM would have; G1 as the JVM's default.
    return [
        java,
        "-Xmx512m",
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp",
        classpath,
        MAIN_CLASS,
    ]


if __name__ == "__main__":
    print(" ".join(command(install())))
