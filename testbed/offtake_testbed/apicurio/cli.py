"""``python -m offtake_testbed.apicurio``: build the registry, or run one in the foreground."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time

from . import __doc__ as _DESCRIPTION
from .install import ApicurioTestbedError, install_apicurio
from .registry import ApicurioRegistry

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m offtake_testbed.apicurio",
        description=_DESCRIPTION,
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
