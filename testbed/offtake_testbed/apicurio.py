"""A real schema registry for tests and demos: Apicurio Registry, in-memory storage, serving the
Confluent-compatible API (``/apis/ccompat/v6``) that confluent-kafka's client speaks.

Maven Central has Apicurio's application module (``io.apicurio:apicurio-registry-app``) but no
runnable jar, so the test bed builds one: it writes a small Maven project into
``cache_dir("apicurio", <version>, "build")`` that depends on the application module and
packages it with the Quarkus Maven plugin, then keeps the runner jar and its ``lib/`` folder in
``cache_dir("apicurio", <version>, "app")``. Every registry after that is a plain
``java -jar <runner>.jar`` on a free loopback port. Nothing built is committed.

    python -m offtake_testbed.apicurio install        # build (once), print the folder
    python -m offtake_testbed.apicurio run --port N   # foreground registry until Ctrl-C

Why 2.4.2.Final: it is the newest release whose every dependency Maven Central serves (3.x
and 2.5+ need ``apicurio-registry-schema-util-provider`` versions that Central does not have).
Two of its dependencies are not on Central in the versions it names and are replaced by ones
that are (see :func:`_pom`); its own classes carry no Jandex index, so the build indexes the
application module explicitly (``quarkus.index-dependency``).
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

from ._cache import Progress, cache_dir, folder_size, megabytes
from ._service import Service
from .kafka import (
    _die_with_parent_fn,
    _find_java,
    _free_port,
    _locked,
    _maven_errors,
    _tail_text,
    _terminate,
    run_maven,
)

__all__ = [
    "APICURIO_VERSION",
    "ApicurioRegistry",
    "ApicurioTestbedError",
    "install_apicurio",
    "main",
]

APICURIO_VERSION = "2.4.2.Final"
# The Quarkus version Apicurio 2.4.2.Final is built on (its parent pom's quarkus.version).
_QUARKUS_VERSION = "2.16.4.Final"
# apicurio-common-app-components-config-index-deployment 0.1.18.Final (what 2.4.2 names) is
# not on Central; 0.1.10.Final of the runtime and deployment pair is.
_CONFIG_INDEX_VERSION = "0.1.10.Final"
# org.everit.json.schema 1.14.2 is published outside Central; its maintainer's fork of the
# same classes is on Central under com.github.erosb.
_EVERIT_VERSION = "1.14.2"
_MARKER = ".offtake-installed"
_MVN_TIMEOUT_S = 1500.0
_CCOMPAT_PATH = "/apis/ccompat/v6"

_log = logging.getLogger(__name__)


class ApicurioTestbedError(RuntimeError):
    """Building or running the test registry failed; the message says why and what to do."""


# --------------------------------------------------------------------------------------------
# Installation (a Maven build, once)
# --------------------------------------------------------------------------------------------


def install_apicurio(version: str = APICURIO_VERSION, *, progress: IO[str] | None = None) -> Path:
    """Build the runnable registry into the cache (once); return the runner jar's path."""
    say = Progress("apicurio", progress)
    version_dir = cache_dir("apicurio", version)
    app = version_dir / "app"
    if _is_installed(version_dir, app):
        say.cached(f"Apicurio Registry {version} ({_summary(app)})", app)
        return _runner(app)
    with _locked(version_dir / ".install.lock"):
        if _is_installed(version_dir, app):
            say.cached(f"Apicurio Registry {version} ({_summary(app)})", app)
            return _runner(app)
        started = time.monotonic()
        _build(version, version_dir, app, say)
        say.say(
            f"Apicurio Registry {version}: {_summary(app)} in {app}, "
            f"built in {time.monotonic() - started:.1f} s"
        )
    return _runner(app)


def _is_installed(version_dir: Path, app: Path) -> bool:
    return (version_dir / _MARKER).is_file() and any(app.glob("*-runner.jar"))


def _runner(app: Path) -> Path:
    return next(app.glob("*-runner.jar"))


def _summary(app: Path) -> str:
    count, size = folder_size(app)
    return f"{count} files, {megabytes(size)}"


def _build(version: str, version_dir: Path, app: Path, say: Progress) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ApicurioTestbedError("mvn not found on PATH: Maven 3.6+ builds the test registry")
    build = version_dir / "build"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    (build / "pom.xml").write_text(_pom(version))
    # Apicurio's parent pom names repositories besides Central; only Central is reachable.
    (build / "settings.xml").write_text(_SETTINGS)
    command = [
        mvn,
        "-B",
        "-U",
        "-Dstyle.color=never",
        "-s",
        str(build / "settings.xml"),
        f"-Dmaven.repo.local={cache_dir('maven', 'repository')}",
        "-DskipTests",
        # The parent's release-time checks need files of Apicurio's own source tree.
        "-Dcheckstyle.skip=true",
        "-Denforcer.skip=true",
        "-Dlicense.skip=true",
        "-Djacoco.skip=true",
        "-Dmaven.javadoc.skip=true",
        "-Dmaven.source.skip=true",
        # The application module has no Jandex index: without this its beans are not found.
        "-Dquarkus.index-dependency.app.group-id=io.apicurio",
        "-Dquarkus.index-dependency.app.artifact-id=apicurio-registry-app",
        "package",
    ]
    say.say(
        f"building Apicurio Registry {version} from io.apicurio:apicurio-registry-app with the "
        "Quarkus Maven plugin (a cold cache downloads about 250 MB; a few minutes)"
    )
    _run_maven(command, build, say)
    target = build / "target"
    runners = list(target.glob("*-runner.jar"))
    if not runners or not (target / "lib").is_dir():
        raise ApicurioTestbedError(f"Maven finished but no runner jar and lib/ in {target}")
    with tempfile.TemporaryDirectory(prefix="app-", dir=version_dir) as work:
        staging = Path(work) / "app"
        staging.mkdir()
        shutil.copy2(runners[0], staging / runners[0].name)
        shutil.copytree(target / "lib", staging / "lib")
        # Swap in the complete folder only now, so a crash never leaves a half-filled app/.
        shutil.rmtree(app, ignore_errors=True)
        staging.rename(app)
    shutil.rmtree(build, ignore_errors=True)  # a build product, not needed to run
    (version_dir / _MARKER).write_text(f"apicurio-registry-app {version}\n")


def _run_maven(command: list[str], work: Path, say: Progress) -> None:
    code, output = run_maven(command, work, say, _MVN_TIMEOUT_S)
    if code is None:
        raise ApicurioTestbedError(f"Maven did not build the registry in {_MVN_TIMEOUT_S:.0f}s")
    if code != 0:
        tail = _maven_errors(output)
        raise ApicurioTestbedError(f"building Apicurio Registry failed:\n{tail}")


_SETTINGS = """<settings>
  <mirrors>
    <mirror><id>central-only</id><mirrorOf>*</mirrorOf><url>https://repo.maven.apache.org/maven2</url></mirror>
  </mirrors>
</settings>
"""


def _pom(version: str) -> str:
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <!-- Apicurio's own parent: its dependency management (Quarkus {_QUARKUS_VERSION}). -->
  <parent>
    <groupId>io.apicurio</groupId>
    <artifactId>apicurio-registry</artifactId>
    <version>{version}</version>
    <relativePath/>
  </parent>
  <groupId>dev.offtake.testbed</groupId>
  <artifactId>apicurio-registry-runner</artifactId>
  <packaging>jar</packaging>
  <dependencyManagement>
    <dependencies>
      <dependency>
        <groupId>io.apicurio</groupId>
        <artifactId>apicurio-common-app-components-config-index</artifactId>
        <version>{_CONFIG_INDEX_VERSION}</version>
      </dependency>
      <dependency>
        <groupId>io.apicurio</groupId>
        <artifactId>apicurio-common-app-components-config-index-deployment</artifactId>
        <version>{_CONFIG_INDEX_VERSION}</version>
      </dependency>
    </dependencies>
  </dependencyManagement>
  <dependencies>
    <dependency>
      <groupId>io.apicurio</groupId>
      <artifactId>apicurio-registry-app</artifactId>
      <version>{version}</version>
      <exclusions>
        <exclusion>
          <groupId>com.github.everit-org.json-schema</groupId>
          <artifactId>org.everit.json.schema</artifactId>
        </exclusion>
      </exclusions>
    </dependency>
    <dependency>
      <groupId>com.github.erosb</groupId>
      <artifactId>everit-json-schema</artifactId>
      <version>{_EVERIT_VERSION}</version>
    </dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>io.quarkus</groupId>
        <artifactId>quarkus-maven-plugin</artifactId>
        <version>{_QUARKUS_VERSION}</version>
        <executions>
          <execution>
            <goals><goal>build</goal></goals>
          </execution>
        </executions>
      </plugin>
    </plugins>
  </build>
</project>
"""


# --------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------


class ApicurioRegistry(Service):
    """One Apicurio Registry on 127.0.0.1 with in-memory storage (H2 in memory).

    :meth:`freeze` and :meth:`thaw` stop and continue the JVM (SIGSTOP / SIGCONT): a registry
    that is down for clients (requests time out) but keeps what it stored, as a real outage
    of a registry with durable storage does.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        version: str = APICURIO_VERSION,
        heap: str = "384m",
        start_timeout: float = 180.0,  # a loaded 2-core box: the JVM alone takes 15-40 s
    ) -> None:
        self.version = version
        self.heap = heap
        self.start_timeout = start_timeout
        self._requested_port = port
        self._port: int | None = None
        self._workdir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        if self._port is None or self._process is None:
            raise ApicurioTestbedError("the registry is not running; call start() first")
        return self._port

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL, for SchemaRegistryClient's ``url``."""
        return f"http://127.0.0.1:{self.port}{_CCOMPAT_PATH}"

    @property
    def log_path(self) -> Path:
        if self._workdir is None:
            raise ApicurioTestbedError("the registry is not running; call start() first")
        return self._workdir / "registry.log"

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> ApicurioRegistry:
        if self._process is not None:
            raise ApicurioTestbedError(f"the registry is already running on {self.url}")
        java = _find_java()
        runner = install_apicurio(self.version)
        self._workdir = Path(tempfile.mkdtemp(prefix=f"offtake-apicurio-{os.getpid()}-"))
        try:
            self._port = self._requested_port or _free_port()
            command = [
                java,
                f"-Xmx{self.heap}",
                "-XX:+UseSerialGC",  # 2 cores shared by everything: no parallel GC threads
                "-XX:TieredStopAtLevel=1",  # starts faster; a test registry needs no C2
                "-Dquarkus.profile=prod",
                "-Dquarkus.http.host=127.0.0.1",
                f"-Dquarkus.http.port={self._port}",
                "-Dquarkus.log.level=WARN",
                '-Dquarkus.log.category."io.apicurio".level=WARN',
                "-Dregistry.auth.enabled=false",
                "-jar",
                str(runner),
            ]
            with self.log_path.open("wb") as out:
                self._process = subprocess.Popen(
                    command,
                    cwd=self._workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_die_with_parent_fn(),
                )
            atexit.register(self._kill_at_exit)
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 20.0) -> None:
        atexit.unregister(self._kill_at_exit)
        if self._process is not None:
            self.thaw()  # a frozen JVM cannot act on SIGTERM
            _terminate(self._process, timeout)
            self._process = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        self._port = None

    def freeze(self) -> None:
        """Stop the JVM (SIGSTOP): connections are accepted by the kernel, never answered."""
        if self._process is not None and self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """Let a frozen JVM go on (SIGCONT)."""
        if self._process is not None and self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGCONT)

    def subjects(self) -> list[str]:
        """The registered subjects (a readiness check, and for tests)."""
        with urllib.request.urlopen(f"{self.url}/subjects", timeout=5) as response:
            return list(json.loads(response.read()))

    def log_tail(self, lines: int = 40) -> str:
        path = self._workdir / "registry.log" if self._workdir is not None else None
        text = path.read_text(errors="replace") if path is not None and path.is_file() else ""
        return _tail_text(text, lines) or "(the registry wrote no output)"

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last = ""
        while True:
            if self._process is not None and self._process.poll() is not None:
                raise ApicurioTestbedError(
                    f"the registry exited with code {self._process.returncode}:\n{self.log_tail()}"
                )
            try:
                self.subjects()
                return
            except (OSError, urllib.error.URLError, ValueError) as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                raise ApicurioTestbedError(
                    f"the registry did not answer on {self.url} within {self.start_timeout:g}s "
                    f"(last error: {last}):\n{self.log_tail()}"
                )
            time.sleep(0.25)

    def _kill_at_exit(self) -> None:
        self.stop(timeout=5.0)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m offtake_testbed.apicurio",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("install", help="build the registry (once), print the runner jar")
    run = commands.add_parser("run", help="run a registry until Ctrl-C")
    run.add_argument("--port", type=int, default=None, help="HTTP port (default: a free one)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "install":
            print(install_apicurio(progress=sys.stderr))
            return 0
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        began = time.monotonic()
        with ApicurioRegistry(args.port) as registry:
            print(f"Apicurio Registry ready in {time.monotonic() - began:.1f}s", flush=True)
            print(f"url (Confluent-compatible API): {registry.url}", flush=True)
            try:
                while registry.is_running():
                    time.sleep(0.5)
            except KeyboardInterrupt:
                return 0
            print(f"the registry exited unexpectedly:\n{registry.log_tail()}", file=sys.stderr)
            return 1
    except ApicurioTestbedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
