"""``python -m offtake_testbed.node install``: build the test bed node's binaries."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..gobuild import KubeBuildError
from .install import NodeError, install_node

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m offtake_testbed.node")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "install",
        help="build kubelet, kube-scheduler, containerd, runc, CNI plugins, prometheus-adapter",
    )
    args = parser.parse_args(argv)
    if args.command == "install":
        try:
            print(install_node(progress=sys.stderr).bin_dir)
        except (NodeError, KubeBuildError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0
