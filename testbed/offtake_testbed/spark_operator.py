"""The Kubeflow Spark operator, from its Go module on the Go module proxy: its SparkConnect CRD,
and (for the node tier) its controller binary.

The operator's ``submit.mode: kubernetes`` makes a SparkConnect per pipeline; the e2e tier
installs the real CRD into its real kube-apiserver so the API server validates what the
operator renders against the Spark operator's own schema. ``go mod download`` fetches the
module zip (config/crd/bases holds the CRDs); the CRD is kept in the Offtake cache.

The node tier runs the real controller: ``go build ./cmd/operator`` inside a copy of the same
module (its go.mod pins k8s.io to v0.32.5 with replace directives, which only hold when the
module is the main module, so it cannot be built as a dependency of a throwaway module), with
its own go.sum (``-mod=readonly``: nothing is re-resolved). Cached under
``cache_dir("spark-operator", version, "bin")``::

    python -m offtake_testbed.spark_operator install    # a few minutes cold on two cores, once
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from offtake_testbed._cache import cache_dir, cache_lock, installed, mark_installed
from offtake_testbed._service import Service
from offtake_testbed.gobuild import KubeBuildError, run_go
from offtake_testbed.process import die_with_parent, file_tail, free_port, terminate

MODULE = "github.com/kubeflow/spark-operator/v2"
VERSION = "v2.3.0"
CRD_FILE = "sparkoperator.k8s.io_sparkconnects.yaml"
CRD_NAME = "sparkconnects.sparkoperator.k8s.io"


_CRD_FILES = (
    "sparkoperator.k8s.io_sparkapplications.yaml",
    "sparkoperator.k8s.io_scheduledsparkapplications.yaml",
    CRD_FILE,
)
_PACKAGE = "./cmd/operator"
_RECIPE = 1


def _module_dir(home: Path, version: str) -> Path:
    """The module's unpacked source in the Go module cache (downloaded if missing)."""
    out = run_go(
        ["mod", "download", "-json", f"{MODULE}@{version}"],
        cwd=home,
        log=home / "download.log",
        what=f"downloading {MODULE}@{version} from the Go module proxy",
        extra_env={"GOFLAGS": "-modcacherw"},
    )
    return Path(json.loads(out)["Dir"])


def spark_connect_crd(version: str = VERSION) -> Path:
    """The SparkConnect CRD yaml of spark-operator ``version`` (downloaded once, cached)."""
    home = cache_dir("spark-operator", version)
    crd = home / CRD_FILE
    if crd.exists():
        return crd
    with cache_lock(f"spark-operator-{version}"):
        if crd.exists():
            return crd
        module_dir = _module_dir(home, version)
        shutil.copyfile(module_dir / "config" / "crd" / "bases" / CRD_FILE, crd)
    return crd


def _installed(bin_dir: Path, version: str) -> bool:
    expected = {"recipe": _RECIPE, "version": version}
    return installed(bin_dir, expected, bin_dir / "spark-operator") is not None


def install_spark_operator(version: str = VERSION, *, progress: bool = False) -> Path:
    """Build (once) the spark-operator binary of ``version``; return its path.

    ``spark-operator controller start`` is the controller the chart's Deployment runs."""
    home = cache_dir("spark-operator", version)
    bin_dir = cache_dir("spark-operator", version, "bin")
    binary = bin_dir / "spark-operator"

    def say(message: str) -> None:
        if progress:
            print(f"[offtake spark-operator] {message}", file=sys.stderr, flush=True)

    if _installed(bin_dir, version):
        say(f"found spark-operator {version} in the cache: {binary}")
        return binary
    with cache_lock(f"spark-operator-{version}"):
        if _installed(bin_dir, version):
            return binary
        log = home / "build.log"
        log.write_text(f"building spark-operator {version}\n")
        say(f"building spark-operator {version} (log: {log})")
        started = time.monotonic()
        src = home / "src"
        if src.exists():
            shutil.rmtree(src)
        # A writable copy: the module cache is read-only, and go build writes nothing there
        # with -mod=readonly, but the copy keeps the build independent of -modcacherw.
        shutil.copytree(_module_dir(home, version), src)
        for path in [src, *src.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
        tmp = bin_dir / ".spark-operator.tmp"
        run_go(
            ["build", "-ldflags=-s -w", "-o", str(tmp), _PACKAGE],
            cwd=src,
            log=log,
            what=f"building spark-operator {version}",
            extra_env={"GOFLAGS": "-trimpath -buildvcs=false -mod=readonly"},
        )
        tmp.replace(binary)
        seconds = round(time.monotonic() - started, 1)
        marker = {"recipe": _RECIPE, "version": version, "build_seconds": seconds}
        mark_installed(bin_dir, marker)
        shutil.rmtree(src)
        say(f"built in {seconds} s: {binary}")
        return binary


def crd_files(version: str = VERSION) -> list[Path]:
    """The CRDs the controller watches (SparkApplication, ScheduledSparkApplication and
    SparkConnect): its manager starts informers for all three, so all must be installed."""
    home = cache_dir("spark-operator", version)
    missing = [n for n in _CRD_FILES if not (home / n).exists()]
    if missing:
        with cache_lock(f"spark-operator-{version}"):
            module_dir = _module_dir(home, version)
            for name in missing:
                shutil.copyfile(module_dir / "config" / "crd" / "bases" / name, home / name)
    return [home / n for n in _CRD_FILES]


class SparkOperatorError(RuntimeError):
    """The controller exited or never became healthy; the message ends with its log's tail."""


class SparkOperator(Service):
    """The spark-operator controller (``spark-operator controller start``) as a process of
    this machine, against the test bed's apiserver through ``kubeconfig``: the same binary and
    reconcilers as the chart's in-cluster Deployment, out of the cluster. No webhook (the
    controller command has none; the chart runs it as another Deployment), no leader election,
    no metrics endpoint; it watches ``namespaces`` only.

    ``service_host`` and ``service_port`` are what a pod would find in KUBERNETES_SERVICE_HOST
    and _PORT: the SparkConnect controller reads them from its own environment to give the
    Connect server its ``--master k8s://https://host:port``, so they must name an address the
    server pod reaches the apiserver at, not this process's loopback one.
    """

    def __init__(
        self,
        kubeconfig: Path,
        namespaces: Sequence[str],
        *,
        service_host: str,
        service_port: int,
        start_timeout: float = 120.0,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespaces = list(namespaces)
        self.service_host, self.service_port = service_host, service_port
        self.start_timeout = start_timeout
        self.workdir = Path(tempfile.mkdtemp(prefix="offtake-spark-operator-"))
        self.log = self.workdir / "spark-operator.log"
        self.health_port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        binary = install_spark_operator()
        self.health_port = free_port()
        env = dict(
            os.environ,
            KUBECONFIG=str(self.kubeconfig),
            KUBERNETES_SERVICE_HOST=self.service_host,
            KUBERNETES_SERVICE_PORT=str(self.service_port),
        )
        args = [
            str(binary),
            "controller",
            "start",
            f"--namespaces={','.join(self.namespaces)}",
            "--leader-election=false",
            "--enable-metrics=false",
            "--enable-ui-service=false",
            f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
            "--controller-threads=2",
            "--zap-log-level=info",
        ]
        with self.log.open("wb") as log:
            self._proc = subprocess.Popen(
                args,
                cwd=self.workdir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent(),
            )
        deadline = time.monotonic() + self.start_timeout
        while not self._ready():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                code = self._proc.poll()
                self.stop()
                state = f"exited {code}" if code is not None else "not ready in time"
                raise SparkOperatorError(
                    f"spark-operator controller {state}; log {self.log}:\n{file_tail(self.log, 30)}"
                )
            time.sleep(0.5)
        return self

    def _ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.health_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def log_tail(self, lines: int = 40) -> str:
        return file_tail(self.log, lines)

    def stop(self) -> None:
        if self._proc is not None:
            terminate(self._proc, timeout=20)
            self._proc = None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m offtake_testbed.spark_operator")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help=f"build the spark-operator {VERSION} controller binary")
    args = parser.parse_args(argv)
    if args.command == "install":
        try:
            print(install_spark_operator(progress=True))
        except KubeBuildError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
