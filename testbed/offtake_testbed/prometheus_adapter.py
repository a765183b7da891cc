"""prometheus-adapter for the test bed's node tier: it serves Prometheus series to the
apiserver as external metrics (an APIService), which the kube-controller-manager's HPA reads.

Built from the Go module proxy like the control plane and cached next to it::

    python -m offtake_testbed.prometheus_adapter install   # ~5 minutes cold on two cores, once
    python -m offtake_testbed.node install                 # builds it too

``go install sigs.k8s.io/prometheus-adapter/cmd/adapter@v0.12.0`` is refused: it first reads
the module's version list for deprecation notices, and the proxy answers that list with 403
while it serves the version itself. So, as for runc and etcd, the adapter is built inside a
throwaway module that requires the exact version (its own go.mod has no replace directives,
so the selected dependency versions are its own).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from ._cache import cache_dir, cache_lock, installed, mark_installed
from .gobuild import KubeBuildError, go_build, init_module, run_go, write_tools

__all__ = ["PROMETHEUS_ADAPTER_VERSION", "install_prometheus_adapter"]

PROMETHEUS_ADAPTER_VERSION = "v0.12.0"
_MODULE = "sigs.k8s.io/prometheus-adapter"
_PACKAGE = f"{_MODULE}/cmd/adapter"
_RECIPE = 1


def _installed(bin_dir: Path) -> bool:
    expected = {"recipe": _RECIPE, "version": PROMETHEUS_ADAPTER_VERSION}
    return installed(bin_dir, expected, bin_dir / "prometheus-adapter") is not None


def install_prometheus_adapter(*, progress: IO[str] | None = None) -> Path:
    """Build (once) prometheus-adapter; return the path of its binary."""
    bin_dir = cache_dir("kube", "prometheus-adapter", PROMETHEUS_ADAPTER_VERSION, "bin")
    binary = bin_dir / "prometheus-adapter"

    def say(message: str) -> None:
        if progress is not None:
            print(f"[offtake prometheus-adapter] {message}", file=progress, flush=True)

    if _installed(bin_dir):
        say(f"found prometheus-adapter {PROMETHEUS_ADAPTER_VERSION} in the cache: {binary}")
        return binary
    with cache_lock(f"prometheus-adapter-{PROMETHEUS_ADAPTER_VERSION}"):
        if _installed(bin_dir):
            return binary
        log = cache_dir("kube", "prometheus-adapter", "logs") / "build.log"
        log.write_text(f"building prometheus-adapter {PROMETHEUS_ADAPTER_VERSION}\n")
        say(f"building prometheus-adapter {PROMETHEUS_ADAPTER_VERSION} (log: {log})")
        started = time.monotonic()
        src = cache_dir("kube", "prometheus-adapter", PROMETHEUS_ADAPTER_VERSION, "src")
        init_module(src, "offtake.local/adapterbuild", log)
        run_go(
            ["mod", "edit", f"-require={_MODULE}@{PROMETHEUS_ADAPTER_VERSION}"],
            cwd=src,
            log=log,
            what="go mod edit (prometheus-adapter)",
        )
        write_tools(src, [_PACKAGE])
        run_go(["mod", "tidy"], cwd=src, log=log, what="go mod tidy (prometheus-adapter)")
        download = round(time.monotonic() - started, 1)
        build = go_build(src, _PACKAGE, binary, log)
        marker = {
            "recipe": _RECIPE,
            "version": PROMETHEUS_ADAPTER_VERSION,
            "build_seconds": {"download": download, "build": build},
        }
        mark_installed(bin_dir, marker)
        say(f"built in {round(time.monotonic() - started, 1)} s: {binary}")
        return binary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m offtake_testbed.prometheus_adapter")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help=f"build prometheus-adapter {PROMETHEUS_ADAPTER_VERSION}")
    args = parser.parse_args(argv)
    if args.command == "install":
        try:
            print(install_prometheus_adapter(progress=sys.stderr))
        except KubeBuildError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
