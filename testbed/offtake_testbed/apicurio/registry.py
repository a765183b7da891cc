"""A running Apicurio Registry on a free loopback port (see :mod:`offtake_testbed.apicurio`)."""

from __future__ import annotations

import atexit
import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import NamedTuple

from .._service import Service
from ..maven import find_java
from ..process import die_with_parent, free_port, tail, terminate
from .install import (
    APICURIO_VERSION,
    BASIC_AUTH_BUILD_PROPERTIES,
    ApicurioTestbedError,
    install_apicurio,
)

__all__ = ["ApicurioRegistry", "RegistryTls"]

_CCOMPAT_PATH = "/apis/ccompat/v6"


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
            # (BASIC_AUTH_BUILD_PROPERTIES); the same settings again, as the runtime checks
            # that build-time values were not changed.
            props += list(BASIC_AUTH_BUILD_PROPERTIES)
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
