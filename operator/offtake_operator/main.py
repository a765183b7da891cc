"""``offtake-operator``: run the kopf operator with Offtake's handlers.

Serves all namespaces unless OFFTAKE_NAMESPACES (or --namespace) names some. Two or more
replicas are safe with peering (OFFTAKE_PEERING or --peering): each replica takes a random
priority, the highest one works and the others stand by (kopf pauses lower-priority peers)
until it stops renewing its peering record.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Sequence

import kopf

from . import metrics
from .context import MEMO_KEY, OperatorContext
from .settings import OperatorConfig, SettingsError


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="offtake-operator", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="serve this namespace (repeatable; default: OFFTAKE_NAMESPACES or all)",
    )
    parser.add_argument(
        "--peering",
        default=None,
        help="kopf peering object name for multi-replica safety (default: OFFTAKE_PEERING)",
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=None,
        help="peering priority (default: OFFTAKE_PEERING_PRIORITY or random)",
    )
    parser.add_argument(
        "--liveness",
        default=os.environ.get("OFFTAKE_LIVENESS_ENDPOINT", "http://0.0.0.0:8080/healthz"),
        help="kopf liveness endpoint URL, or '' for none",
    )
    parser.add_argument("--verbose", "-v", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = OperatorConfig.from_env()
    except SettingsError as exc:
        print(f"offtake-operator: {exc}", file=sys.stderr)
        return 2
    namespaces = tuple(args.namespace) or config.namespaces
    peering = config.peering if args.peering is None else args.peering
    config = OperatorConfig(**{**config.__dict__, "namespaces": namespaces, "peering": peering})
    priority = args.priority
    if priority is None:
        raw = os.environ.get("OFFTAKE_PEERING_PRIORITY", "")
        priority = int(raw) if raw else random.SystemRandom().randint(1, 2**31 - 1)
    # kopf's formatter prefixes each object's lines with [namespace/name]; JSON for log stacks.
    log_format = (
        kopf.LogFormat.JSON
        if os.environ.get("OFFTAKE_LOG_FORMAT") == "json"
        else kopf.LogFormat.FULL
    )
    kopf.configure(debug=args.verbose, verbose=args.verbose, log_format=log_format, log_prefix=True)

    from . import handlers, webhook  # noqa: F401  (registers the handlers with kopf)

    metrics.serve(config.metrics_port)
    kopf.run(
        clusterwide=not namespaces,
        namespaces=namespaces,
        standalone=not peering,
        peering_name=peering or None,
        priority=priority,
        liveness_endpoint=args.liveness or None,
        memo=kopf.Memo({MEMO_KEY: OperatorContext(config)}),
        registry=webhook.registry_for(config),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
