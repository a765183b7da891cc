"""``python -m offtake_testbed.kafka``: install Kafka, or run a broker in the foreground."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time

from . import __doc__ as _DESCRIPTION
from .broker import PROTOCOLS, KafkaBroker
from .install import KAFKA_VERSION, KafkaTestbedError, install_kafka

__all__ = ["main"]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m offtake_testbed.kafka",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Shared by both commands, so the option may follow the command name.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--kafka-version", default=KAFKA_VERSION, help="%(default)s by default")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("install", parents=[common], help="fetch the jars, print their folder")
    run = commands.add_parser("run", parents=[common], help="run a broker until Ctrl-C")
    run.add_argument("--port", type=int, default=None, help="client port (default: a free one)")
    run.add_argument(
        "--scram-user",
        action="append",
        default=[],
        metavar="NAME:PASSWORD",
        help="add a SCRAM-SHA-512 user and a SASL_PLAINTEXT listener (repeatable)",
    )
    run.add_argument(
        "--tls",
        action="store_true",
        help="add TLS listeners (and SASL_SSL with --scram-user); prints the CA file",
    )
    return parser.parse_args(argv)


def _scram_users(specs: list[str]) -> dict[str, str]:
    users = {}
    for spec in specs:
        name, sep, password = spec.partition(":")
        if not (sep and name and password):
            raise KafkaTestbedError(f"--scram-user {spec!r}: expected NAME:PASSWORD")
        users[name] = password
    return users


def _run_foreground(broker: KafkaBroker) -> int:
    # SIGTERM (e.g. from a supervisor) should stop the broker as cleanly as Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    began = time.monotonic()
    with broker:
        print(f"Kafka {broker.version} ready in {time.monotonic() - began:.1f}s", flush=True)
        print(f"bootstrap: {broker.bootstrap}", flush=True)
        print(f"log: {broker.log_path}", flush=True)
        for name, address in broker.secured_listeners.items():
            print(f"{name} ({PROTOCOLS[name]}): {address}", flush=True)
        if broker.tls:
            ca = broker.workdir / "ca.crt"
            ca.write_text(broker.ca_pem)
            print(f"CA certificate (ssl.ca.location): {ca}", flush=True)
        try:
            while broker.is_running():
                time.sleep(0.5)
        except KeyboardInterrupt:
            print("stopping", flush=True)
            return 0
        print(f"the broker exited unexpectedly:\n{broker.log_tail()}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "install":
            print(install_kafka(args.kafka_version, progress=sys.stderr))
            return 0
        broker = KafkaBroker(
            args.port,
            version=args.kafka_version,
            scram_users=_scram_users(args.scram_user),
            tls=args.tls,
        )
        return _run_foreground(broker)
    except KafkaTestbedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
