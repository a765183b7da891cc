"""A throwaway PostgreSQL server for the JDBC sink's tests (Debian's package).

``PostgresServer().start()`` installs the package if it is missing (apt-get, as root), creates
a cluster in a fresh temporary folder with initdb, and starts it with pg_ctl on a free
loopback port, trusting local connections. PostgreSQL refuses to run as root, so when the
tests run as root the cluster belongs to the ``postgres`` user (created by the package) and
its commands run through runuser. ``stop()`` stops the server and deletes the folder;
``shut_down()`` and ``start_again()`` stop the server and start it again on the same port with
its data kept (a database outage, for the chaos suite).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

from ._cache import Progress
from ._service import Service
from .process import free_port

__all__ = ["PostgresServer", "PostgresTestbedError", "install_postgres"]


class PostgresTestbedError(Exception):
    """PostgreSQL could not be installed or started; the message says which step failed."""


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def install_postgres(*, progress: IO[str] | None = None) -> Path:
    """Return PostgreSQL's bin folder, installing Debian's package first if needed.

    Progress lines go to ``progress`` (e.g. ``sys.stderr``) if given.
    """
    say = Progress("postgres", progress)
    bindir = _bin_dir()
    if bindir is not None:
        say.say(f"found PostgreSQL installed: {bindir}")
        return bindir
    if os.geteuid() != 0:
        raise PostgresTestbedError("PostgreSQL is not installed and apt-get needs root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for what, cmd in (
        ("apt-get update: refreshing Debian's package lists", ["apt-get", "update"]),
        (
            "apt-get install postgresql (Debian's package, about 50 MB with its dependencies)",
            ["apt-get", "install", "-y", "postgresql"],
        ),
    ):
        with say.timed(what):
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise PostgresTestbedError(f"{' '.join(cmd)} failed: {done.stderr[-2000:]}")
    bindir = _bin_dir()
    if bindir is None:
        raise PostgresTestbedError("apt-get installed postgresql but no initdb was found")
    return bindir


class PostgresServer(Service):
    """One PostgreSQL cluster on 127.0.0.1:<port>, database ``postgres``, user ``postgres``."""

    def __init__(self) -> None:
        self.port = 0
        self.user = "postgres"
        self.database = "postgres"
        self._dir: Path | None = None
        self._bindir: Path | None = None
        self._run_as: list[str] = []
        self._opts = ""

    @property
    def jdbc_url(self) -> str:
        return f"jdbc:postgresql://127.0.0.1:{self.port}/{self.database}"

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} dbname={self.database} user={self.user}"

    def _cmd(self, *args: str) -> list[str]:
        return [*self._run_as, *args]

    def start(self, timeout: float = 60.0) -> PostgresServer:
        self._bindir = install_postgres()
        self._dir = Path(tempfile.mkdtemp(prefix="offtake-pg-"))
        if os.geteuid() == 0:
            shutil.chown(self._dir, "postgres", "postgres")
            self._run_as = ["runuser", "-u", "postgres", "--"]
        data = self._dir / "data"
        self._check(
            self._cmd(
                str(self._bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                self.user,
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ),
            "initdb",
        )
        self.port = free_port()
        self._opts = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self._dir} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        self._pg_ctl_start(timeout)
        return self

    def _pg_ctl_start(self, timeout: float) -> None:
        assert self._dir is not None and self._bindir is not None
        data = self._dir / "data"
        self._check(
            self._cmd(
                str(self._bindir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(self._dir / "server.log"),
                "-o",
                self._opts,
                "-w",
                "-t",
                str(int(timeout)),
                "start",
            ),
            "pg_ctl start",
        )
        self._wait(timeout)

    def shut_down(self) -> None:
        """Stop the server (fast shutdown: open connections are cut), keeping its data."""
        assert self._dir is not None and self._bindir is not None, "start() first"
        self._check(
            self._cmd(
                str(self._bindir / "pg_ctl"),
                "-D",
                str(self._dir / "data"),
                "-m",
                "fast",
                "-w",
                "stop",
            ),
            "pg_ctl stop",
        )

    def start_again(self, timeout: float = 60.0) -> None:
        """Start the server shut_down() stopped, on the same port with the same data."""
        self._pg_ctl_start(timeout)

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise PostgresTestbedError(f"PostgreSQL did not listen on port {self.port}: {self.log()}")

    def _check(self, cmd: list[str], what: str) -> None:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise PostgresTestbedError(
                f"{what} failed ({done.returncode}): {done.stderr[-2000:]} {self.log()}"
            )

    def log(self) -> str:
        if self._dir is None or not (self._dir / "server.log").exists():
            return ""
        return (self._dir / "server.log").read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        if self._dir is None:
            return
        data = self._dir / "data"
        if self._bindir is not None and (data / "postmaster.pid").exists():
            subprocess.run(
                self._cmd(
                    str(self._bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"
                ),
                capture_output=True,
                check=False,
            )
        shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None


def main(argv: list[str] | None = None) -> int:
    """``python -m offtake_testbed.postgres install``: install (once) and print the bin folder."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m offtake_testbed.postgres")
    parser.add_argument("command", choices=["install"])
    parser.parse_args(argv)
    try:
        print(install_postgres(progress=sys.stderr))
    except PostgresTestbedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
