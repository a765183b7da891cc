"""``python -m offtake_testbed.kube``: build, cache and run the Kubernetes test bed."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .._cache import cache_dir
from ..gobuild import KubeBuildError
from .control_plane import ControlPlane, ControlPlaneError
from .install import (
    ETCD_VERSION,
    HELM_VERSION,
    KUBE_VERSION,
    background_build_log,
    control_plane_installed,
    install_control_plane,
    install_helm,
    trim_go_caches,
)

__all__ = ["main"]


def _dir_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / name).lstat().st_size
    return total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m offtake_testbed.kube",
        description="Build, cache and run the Offtake Kubernetes test bed.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install", help="build kube-apiserver, controller-manager, etc.")
    install.add_argument("--version", default=KUBE_VERSION, help="Kubernetes release")
    install.add_argument("--etcd-version", default=ETCD_VERSION)
    install.add_argument("--helm-version", default=HELM_VERSION)
    what = install.add_mutually_exclusive_group()
    what.add_argument("--no-helm", action="store_true", help="do not build helm")
    # scripts/setup.sh --tests builds helm (scripts/lint.sh needs it) beside the rest of the test
    # bed, and the control plane, the long pole, in the background while the tests run.
    what.add_argument("--only-helm", action="store_true", help="build helm alone")
    install.add_argument("--sizes", action="store_true", help="also report the cache's size")
    run = sub.add_parser("run", help="start a control plane and wait for Ctrl-C")
    run.add_argument("--version", default=KUBE_VERSION, help="Kubernetes release")
    run.add_argument("--kubeconfig", type=Path, help="also copy the kubeconfig here")
    built = sub.add_parser(
        "built",
        help="exit 0 if the control plane is built and cached; if not, print where its "
        "background build logs (scripts/setup.sh --tests) and exit 1 (builds nothing)",
    )
    built.add_argument("--version", default=KUBE_VERSION, help="Kubernetes release")
    sub.add_parser(
        "trim",
        help="delete the Go build and module caches (~5 GB); installed binaries stay, "
        "but building another version starts cold",
    )
    args = parser.parse_args(argv)

    try:
        if args.command == "install":
            started = time.monotonic()
            report: dict[str, Any] = {}
            if not args.only_helm:
                paths = install_control_plane(
                    args.version, etcd_version=args.etcd_version, progress=sys.stderr
                )
                report.update((k, str(v)) for k, v in asdict(paths).items())
            if not args.no_helm:
                report["helm"] = str(install_helm(args.helm_version, progress=sys.stderr))
            report["seconds"] = round(time.monotonic() - started, 2)
            if args.sizes:
                report["cache_bytes"] = {
                    "kube": _dir_size(cache_dir("kube")),
                    "helm": _dir_size(cache_dir("helm")),
                    "go": _dir_size(cache_dir("go")),
                }
            print(json.dumps(report, indent=2))
            return 0
        if args.command == "built":
            if control_plane_installed(args.version):
                return 0
            print(background_build_log())
            return 1
        if args.command == "trim":
            trim_go_caches()
            return 0
        paths = install_control_plane(args.version, progress=sys.stderr)
        with ControlPlane(paths) as cp:
            if args.kubeconfig is not None:
                shutil.copyfile(cp.kubeconfig, args.kubeconfig)
            print(f"control plane ready in {cp.start_seconds} s at {cp.server}", file=sys.stderr)
            print(f"export KUBECONFIG={args.kubeconfig or cp.kubeconfig}", flush=True)
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            with contextlib.suppress(KeyboardInterrupt):
                stop.wait()
        return 0
    except (KubeBuildError, ControlPlaneError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
