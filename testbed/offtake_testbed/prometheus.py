"""A real Prometheus (Debian's package) for tests: promtool, and a server that really scrapes.

    python -m offtake_testbed.prometheus install    # apt-get install prometheus if missing

``Prometheus(scrape_configs, rule_files)`` writes a config, starts ``prometheus`` on a free
loopback port with a throw-away TSDB folder, and offers ``query()`` on the HTTP API.
Debian's package is used (not a download) because Debian's registry is one this project may
reach; its service is never started, we run the binary ourselves.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import yaml

from ._cache import Progress
from ._service import Service
from .process import free_port, terminate

__all__ = [
    "Prometheus",
    "PrometheusTestbedError",
    "install_prometheus",
    "promtool",
]


class PrometheusTestbedError(RuntimeError):
    """Prometheus could not be installed, started or queried; the message says why."""


def _binaries() -> tuple[str, str] | None:
    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    return (prom, tool) if prom and tool else None


def install_prometheus(*, progress: IO[str] | None = None) -> tuple[str, str]:
    """Return the paths of (prometheus, promtool), installing Debian's package if missing.

    Progress lines go to ``progress`` (e.g. ``sys.stderr``) if given.
    """
    say = Progress("prometheus", progress)
    found = _binaries()
    if found:
        say.say(f"found prometheus and promtool installed: {found[0]}, {found[1]}")
        return found
    if not shutil.which("apt-get"):
        raise PrometheusTestbedError(
            "prometheus/promtool are not on PATH and apt-get is missing: install the "
            "'prometheus' package of your distribution"
        )
    sudo: list[str] = []
    if os.geteuid() != 0:
        if not shutil.which("sudo"):
            raise PrometheusTestbedError(
                "prometheus is missing and installing it needs root: "
                "run `sudo apt-get install -y prometheus`"
            )
        sudo = ["sudo", "-n"]
    # The package's maintainer scripts try to start its service; without an init system (CI,
    # containers) that is refused harmlessly, and we never rely on it.
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for what, cmd in (
        ("apt-get update: refreshing Debian's package lists", [*sudo, "apt-get", "update", "-qq"]),
        (
            "apt-get install prometheus (Debian's package, about 100 MB with its dependencies)",
            [*sudo, "apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"],
        ),
    ):
        with say.timed(what):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise PrometheusTestbedError(
                    f"`{' '.join(cmd)}` failed ({proc.returncode}):\n{proc.stderr[-2000:]}"
                )
    found = _binaries()
    if not found:
        raise PrometheusTestbedError(
            "apt-get installed 'prometheus' but the binaries are not on PATH"
        )
    return found


def promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """Run promtool (installing it if needed) and return the finished process."""
    _, tool = install_prometheus()
    return subprocess.run(
        [tool, *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


class Prometheus(Service):
    """One Prometheus server on 127.0.0.1 with its own config and TSDB folder."""

    def __init__(
        self,
        scrape_configs: Sequence[dict[str, Any]],
        rule_files: Sequence[str | Path] = (),
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
    ) -> None:
        self.scrape_configs = list(scrape_configs)
        self.rule_files = [str(Path(p).resolve()) for p in rule_files]
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.port = 0
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        if self._dir is None:
            raise PrometheusTestbedError("Prometheus is not started")
        return self._dir / "prometheus.log"

    def start(self, timeout: float = 60.0) -> Prometheus:
        binary, _ = install_prometheus()
        self._dir = Path(tempfile.mkdtemp(prefix="offtake-prometheus-"))
        config = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": self.rule_files,
            "scrape_configs": self.scrape_configs,
        }
        config_path = self._dir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.port = free_port()
        log = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={self._dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1d",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self._dir,
        )
        log.close()
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code, tail = self._proc.returncode, self._log_tail()
                self.stop()
                raise PrometheusTestbedError(f"prometheus exited with {code}:\n{tail}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        tail = self._log_tail()
        self.stop()
        raise PrometheusTestbedError(f"prometheus not ready within {timeout}s:\n{tail}")

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except (OSError, PrometheusTestbedError):
            return "(no log)"

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path> and return its ``data``; errors raise with Prometheus' message."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                payload = json.load(resp)
        except urllib.error.HTTPError as exc:
            payload = json.load(exc)
        if payload.get("status") != "success":
            raise PrometheusTestbedError(
                f"{path} {params}: {payload.get('errorType')}: {payload.get('error')}"
            )
        return payload["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query; returns the result list (vector or matrix entries)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        result = data["result"]
        if data["resultType"] == "scalar":  # [ts, "value"]: wrap like a one-sample vector
            return [{"metric": {}, "value": result}]
        return list(result)

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets")["activeTargets"])

    def wait_for(self, expr: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Poll ``expr`` until it returns data; raise with the targets' state if it never does."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result:
                return result
            if time.monotonic() > deadline:
                health = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in self.targets()]
                raise PrometheusTestbedError(
                    f"no data for {expr!r} within {timeout}s; targets: {health}"
                )
            time.sleep(0.5)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            terminate(proc, 10)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m offtake_testbed.prometheus")
    parser.add_argument("command", choices=["install"])
    parser.parse_args(argv)
    try:
        prom, tool = install_prometheus(progress=sys.stderr)
    except PrometheusTestbedError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"prometheus: {prom}\npromtool: {tool}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
