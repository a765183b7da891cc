"""Building Apicurio Registry (once) with Maven into the cache (see
:mod:`offtake_testbed.apicurio`)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import IO

from .._cache import Progress, cache_dir, folder_size, megabytes
from ..maven import maven_errors, run_maven
from ..process import file_lock

__all__ = [
    "APICURIO_VERSION",
    "BASIC_AUTH_BUILD_PROPERTIES",
    "ApicurioTestbedError",
    "install_apicurio",
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
BASIC_AUTH_BUILD_PROPERTIES = (
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


class ApicurioTestbedError(RuntimeError):
    """Building or running the test registry failed; the message says why and what to do."""


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
        *(BASIC_AUTH_BUILD_PROPERTIES if basic_auth else ()),
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
