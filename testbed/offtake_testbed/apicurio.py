"""A real schema registry for tests and demos: Apicurio Registry (SQL storage on H2, in memory or
in a file that survives a restart; optionally HTTPS and basic auth), serving the
Confluent-compatible API (``/apis/ccompat/v6``) that confluent-kafka's client speaks.

Maven Central has Apicurio's application module (``io.apicurio:apicurio-registry-app``) but no
runnable jar, so the test bed builds one: it writes a small Maven project into
``cache_dir("apicurio", <version>, "build")`` that depends on the application module and
packages it with the Quarkus Maven plugin, then keeps the runner jar and its ``lib/`` folder in
``cache_dir("apicurio", <version>, "app")``. Every registry after that is a plain
``java -jar <runner>.jar`` on a free loopback port. Nothing built is committed.

    python -m offtake_testbed.apicurio install        # build both (once), print the jars
    python -m offtake_testbed.apicurio run --port N   # foreground registry until Ctrl-C

A second build adds Quarkus' own properties-file security extension
(``io.quarkus:quarkus-elytron-security-properties-file``, Apicurio's Quarkus version) for a
registry that needs HTTP basic auth (``ApicurioRegistry(users=...)``); it leaves out Apicurio's
own authentication mechanism (OIDC bearer tokens, which it cannot use without Keycloak and
which, off, still fails every challenge). Both are cached side by side.

Why 2.4.2.Final: it is the newest release whose every dependency Maven Central serves (3.x
and 2.5+ need ``apicurio-registry-schema-util-provider`` versions that Central does not have).
Two of its dependencies are not on Central in the versions it names and are replaced by ones
that are (see :func:`_pom`); its own classes carry no Jandex index, so the build indexes the
application module explicitly (``quarkus.index-dependency``).
"""

from __future__ import annotations

import argparse
import atexit
import base64
import json
import logging
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, NamedTuple

from ._cache import Progress, cache_dir, folder_size, megabytes
from ._service import Service
from .maven import find_java, maven_errors, run_maven
from .process import die_with_parent, file_lock, free_port, tail, terminate

__all__ = [
    "APICURIO_VERSION",
    "ApicurioRegistry",
    "ApicurioTestbedError",
    "RegistryTls",
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
_BASIC_AUTH_FLAVOUR = "-basic-auth"
# Quarkus 2.16 fixes these at build time (HTTP auth mechanisms and path permissions, the
# embedded realm): every path needs an authenticated user, by HTTP basic auth. The users and
# passwords are runtime settings (ApicurioRegistry(users=...)).
_BASIC_AUTH_BUILD_PROPERTIES = (
    "-Dquarkus.security.users.embedded.enabled=true",
    "-Dquarkus.security.users.embedded.plain-text=true",
    "-Dquarkus.http.auth.basic=true",
    "-Dquarkus.http.auth.permission.registry.paths=/*",
    "-Dquarkus.http.auth.permission.registry.policy=authenticated",
    # Apicurio's own mechanism (OIDC bearer tokens), off at runtime (registry.auth.enabled),
    # would still be asked for a challenge and fail (its bearer mechanism is null): left out.
    "-Dquarkus.arc.exclude-types=io.apicurio.common.apps.auth.authn.AppAuthenticationMechanism",
)
_MVN_TIMEOUT_S = 1500.0
_CCOMPAT_PATH = "/apis/ccompat/v6"

_log = logging.getLogger(__name__)


class ApicurioTestbedError(RuntimeError):
    """Building or running the test registry failed; the message says why and what to do."""


# --------------------------------------------------------------------------------------------
# Installation (a Maven build, once)
# --------------------------------------------------------------------------------------------


def install_apicurio(
    version: str = APICURIO_VERSION,
    *,
    progress: IO[str] | None = None,
    basic_auth: bool = False,
) -> Path:
    """Build the runnable registry into the cache (once); return the runner jar's path.

    ``basic_auth``: the build that also holds Quarkus' properties-file security extension
    (users and passwords in configuration, HTTP basic auth), cached beside the plain one."""
    say = Progress("apicurio", progress)
    version_dir = cache_dir("apicurio", version)
    flavour = _BASIC_AUTH_FLAVOUR if basic_auth else ""
    app = version_dir / f"app{flavour}"
    marker = version_dir / f"{_MARKER}{flavour}"
    what = f"Apicurio Registry {version}{' with basic auth' if basic_auth else ''}"
    if _is_installed(marker, app):
        say.cached(f"{what} ({_summary(app)})", app)
        return _runner(app)
    with file_lock(version_dir / f".install{flavour}.lock"):
        if _is_installed(marker, app):
            say.cached(f"{what} ({_summary(app)})", app)
            return _runner(app)
        started = time.monotonic()
        _build(version, version_dir / f"build{flavour}", app, say, basic_auth)
        marker.write_text(f"apicurio-registry-app {version}{flavour}\n")
        say.say(f"{what}: {_summary(app)} in {app}, built in {time.monotonic() - started:.1f} s")
    return _runner(app)


def _is_installed(marker: Path, app: Path) -> bool:
    return marker.is_file() and any(app.glob("*-runner.jar"))


def _runner(app: Path) -> Path:
    return next(app.glob("*-runner.jar"))


def _summary(app: Path) -> str:
    count, size = folder_size(app)
    return f"{count} files, {megabytes(size)}"


def _build(version: str, build: Path, app: Path, say: Progress, basic_auth: bool) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ApicurioTestbedError("mvn not found on PATH: Maven 3.6+ builds the test registry")
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    (build / "pom.xml").write_text(_pom(version, basic_auth))
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
        *(_BASIC_AUTH_BUILD_PROPERTIES if basic_auth else ()),
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
    with tempfile.TemporaryDirectory(prefix="app-", dir=build.parent) as work:
        staging = Path(work) / "app"
        staging.mkdir()
        shutil.copy2(runners[0], staging / runners[0].name)
        shutil.copytree(target / "lib", staging / "lib")
        # Swap in the complete folder only now, so a crash never leaves a half-filled app/.
        shutil.rmtree(app, ignore_errors=True)
        staging.rename(app)
    shutil.rmtree(build, ignore_errors=True)  # a build product, not needed to run


def _run_maven(command: list[str], work: Path, say: Progress) -> None:
    code, output = run_maven(command, work, say, _MVN_TIMEOUT_S)
    if code is None:
        raise ApicurioTestbedError(f"Maven did not build the registry in {_MVN_TIMEOUT_S:.0f}s")
    if code != 0:
        tail = maven_errors(output)
        raise ApicurioTestbedError(f"building Apicurio Registry failed:\n{tail}")


_SETTINGS = """<settings>
  <mirrors>
    <mirror><id>central-only</id><mirrorOf>*</mirrorOf><url>https://repo.maven.apache.org/maven2</url></mirror>
  </mirrors>
</settings>
"""


def _pom(version: str, basic_auth: bool = False) -> str:
    # Quarkus' own users-in-configuration security (HTTP basic auth), same Quarkus version.
    security = (
        f"""
    <dependency>
      <groupId>io.quarkus</groupId>
      <artifactId>quarkus-elytron-security-properties-file</artifactId>
      <version>{_QUARKUS_VERSION}</version>
    </dependency>"""
        if basic_auth
        else ""
    )
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
    </dependency>{security}
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


class RegistryTls(NamedTuple):
    """PEM files of the registry's HTTPS: its certificate and key, and the CA that issued it."""

    cert: Path
    key: Path
    ca: Path


class ApicurioRegistry(Service):
    """One Apicurio Registry on 127.0.0.1; its storage is Apicurio's SQL storage on H2, in
    memory by default, or (``durable=True``) in a database file in the registry's own
    temporary folder, so that what it stored survives a restart of the process.

    Two kinds of outage: :meth:`freeze` and :meth:`thaw` stop and continue the JVM (SIGSTOP /
    SIGCONT: connections are accepted by the kernel, never answered); :meth:`stop_process`
    and :meth:`restart` end the process (connections refused) and start it again on the same
    port, as a registry pod that is replaced (durable storage keeps the schemas and their ids;
    in memory, they are gone).
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        version: str = APICURIO_VERSION,
        heap: str = "384m",
        start_timeout: float = 180.0,  # a loaded 2-core box: the JVM alone takes 15-40 s
        durable: bool = False,
        tls: RegistryTls | None = None,
        users: dict[str, str] | None = None,
    ) -> None:
        """``tls``: the registry serves HTTPS only with this certificate (Quarkus'
        ``quarkus.http.ssl.*``); its CA is what clients verify it with. ``users``: name ->
        password; every request then needs HTTP basic auth as one of them (Quarkus'
        properties-file security, in its own build)."""
        self.version = version
        self.durable = durable
        self.tls = tls
        self.users = dict(users or {})
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
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.port}{_CCOMPAT_PATH}"

    def client_config(self) -> dict[str, str]:
        """SchemaRegistryClient's configuration for this registry: URL, CA, credentials."""
        conf = {"url": self.url}
        if self.tls is not None:
            conf["ssl.ca.location"] = str(self.tls.ca)
        if self.users:
            name, password = next(iter(self.users.items()))
            conf["basic.auth.user.info"] = f"{name}:{password}"
        return conf

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
        self._workdir = Path(tempfile.mkdtemp(prefix=f"offtake-apicurio-{os.getpid()}-"))
        try:
            self._port = self._requested_port or free_port()
            self._launch()
        except BaseException:
            self.stop()
            raise
        return self

    def stop_process(self, timeout: float = 20.0) -> None:
        """End the registry's process (SIGTERM), keeping its port and folder for
        :meth:`restart`; clients meanwhile get connection refused."""
        if self._process is None:
            raise ApicurioTestbedError("the registry is not running; call start() first")
        self.thaw()
        terminate(self._process, timeout)

    def restart(self) -> ApicurioRegistry:
        """Start the process ended by :meth:`stop_process` again, on the same port; returns
        once it answers."""
        if self._process is None or self._workdir is None:
            raise ApicurioTestbedError("the registry was never started; call start() first")
        if self._process.poll() is None:
            raise ApicurioTestbedError(f"the registry is still running on {self.url}")
        self._launch()
        return self

    def _launch(self) -> None:
        assert self._workdir is not None and self._port is not None
        java = find_java(ApicurioTestbedError)
        runner = install_apicurio(self.version, basic_auth=bool(self.users))
        env = dict(os.environ)
        if self.durable:
            # The application's own setting for its datasource (H2 is what the build has);
            # registry.sql.init creates the tables only where they are missing.
            env["REGISTRY_DATASOURCE_URL"] = f"jdbc:h2:file:{self._workdir / 'registry_db'}"
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
            *self._security_properties(),
            "-jar",
            str(runner),
        ]
        with self.log_path.open("ab") as out:
            self._process = subprocess.Popen(
                command,
                cwd=self._workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        atexit.unregister(self._kill_at_exit)
        atexit.register(self._kill_at_exit)
        self._wait_until_ready()

    def _security_properties(self) -> list[str]:
        props: list[str] = []
        if self.tls is not None:
            cert, key = self.tls.cert, self.tls.key
            props += [
                f"-Dquarkus.http.ssl-port={self._port}",
                "-Dquarkus.http.port=0",  # plain HTTP is refused (below), on no fixed port
                "-Dquarkus.http.insecure-requests=disabled",
                f"-Dquarkus.http.ssl.certificate.files={cert}",
                f"-Dquarkus.http.ssl.certificate.key-files={key}",
            ]
        if self.users:
            # Apicurio's own auth (OIDC) stays off; Quarkus' HTTP layer checks every path
            # (_BASIC_AUTH_BUILD_PROPERTIES); the same settings again, as the runtime checks
            # that build-time values were not changed.
            props += list(_BASIC_AUTH_BUILD_PROPERTIES)
            for name, password in self.users.items():
                props += [
                    f"-Dquarkus.security.users.embedded.users.{name}={password}",
                    f"-Dquarkus.security.users.embedded.roles.{name}=user",
                ]
        return props

    def stop(self, timeout: float = 20.0) -> None:
        atexit.unregister(self._kill_at_exit)
        if self._process is not None:
            if self._process.poll() is None:
                self.thaw()  # a frozen JVM cannot act on SIGTERM
                terminate(self._process, timeout)
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
        request = urllib.request.Request(f"{self.url}/subjects")
        if self.users:
            name, password = next(iter(self.users.items()))
            token = base64.b64encode(f"{name}:{password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        context = ssl.create_default_context(cafile=str(self.tls.ca)) if self.tls else None
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            return list(json.loads(response.read()))

    def log_tail(self, lines: int = 40) -> str:
        path = self._workdir / "registry.log" if self._workdir is not None else None
        text = path.read_text(errors="replace") if path is not None and path.is_file() else ""
        return tail(text, lines) or "(the registry wrote no output)"

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
    commands.add_parser(
        "install", help="build the registry and its basic-auth build (once), print the runner jars"
    )
    run = commands.add_parser("run", help="run a registry until Ctrl-C")
    run.add_argument("--port", type=int, default=None, help="HTTP port (default: a free one)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "install":
            print(install_apicurio(progress=sys.stderr))
            print(install_apicurio(progress=sys.stderr, basic_auth=True))
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
