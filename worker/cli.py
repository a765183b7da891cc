"""``offtake worker --pipeline FILE``: the process every ConsumerPipeline pod runs.

Exit codes: 0 graceful stop; 1 stopped by errors.policy=stop; 2 invalid manifest or
configuration; 3 fatal Kafka or internal error; 128+N when a second signal N forced the exit.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from types import FrameType

from offtake.config import ConfigError, load_pipeline

EXIT_CONFIG = 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="offtake", description="Kafka consumer pipelines done right."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="run the worker of one ConsumerPipeline manifest")
    w.add_argument("--pipeline", required=True, help="path of the ConsumerPipeline manifest (YAML)")
    w.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics, /healthz, /readyz here (default spec.metrics.port; 0: any free port)",
    )
    w.add_argument("--log-level", default=os.environ.get("OFFTAKE_LOG_LEVEL", "INFO"))
    w.add_argument(
        "--instance-id",
        default=_instance_id_from_env(),
        help="static group membership (group.instance.id); default $OFFTAKE_GROUP_INSTANCE_ID, "
        "or the pod name ($POD_NAME) when $OFFTAKE_STATIC_MEMBERSHIP is true",
    )
    v = sub.add_parser("validate", help="check a ConsumerPipeline manifest and print the result")
    v.add_argument("pipeline")
    args = parser.parse_args(argv)
    if args.command == "validate":
        return _validate(args.pipeline)
    return _worker(args)


def _instance_id_from_env() -> str | None:
    """Static membership is opt-in: a static member keeps its partitions after it stops."""
    explicit = os.environ.get("OFFTAKE_GROUP_INSTANCE_ID")
    if explicit:
        return explicit
    if os.environ.get("OFFTAKE_STATIC_MEMBERSHIP", "").lower() in ("1", "true", "yes"):
        return os.environ.get("POD_NAME") or None
    return None


def _validate(path: str) -> int:
    try:
        spec = load_pipeline(path)
    except ConfigError as exc:
        print(f"offtake: invalid pipeline manifest: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"{path}: ok (pipeline {spec.namespace}/{spec.name}, sink {spec.sink.kind})")
    return 0


def _worker(args: argparse.Namespace) -> int:
    from offtake.logs import configure_logging

    try:
        spec = load_pipeline(args.pipeline)
    except ConfigError as exc:
        print(f"offtake: invalid pipeline manifest: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(args.log_level, spec.name)
    log = logging.getLogger("offtake.cli")

    from offtake.engine.worker import EXIT_FATAL, Worker
    from offtake.health import Health, MetricsServer
    from offtake.metrics import Metrics
    from offtake.processing.function import FunctionLoadError

    metrics = Metrics(spec.name)
    max_poll_ms = float(spec.kafka.config.get("max.poll.interval.ms", 300_000))
    health = Health(max_poll_interval_s=max_poll_ms / 1000)
    try:
        worker = Worker(spec, metrics=metrics, health=health, instance_id=args.instance_id)
    except (FunctionLoadError, ConfigError, ValueError) as exc:
        print(f"offtake: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    port = spec.metrics.port if args.metrics_port is None else args.metrics_port
    server = MetricsServer(metrics, health, port)
    try:
        server.start()
    except OSError as exc:
        print(
            f"offtake: cannot serve metrics on port {port} (spec.metrics.port): {exc}",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    log.info("metrics, /healthz and /readyz on port %d", server.port)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if worker_stopping[0]:
            # A second signal: the operator (or a person) wants out now, drain or not.
            os._exit(128 + signum)
        worker_stopping[0] = True
        worker.stop(f"received {signal.Signals(signum).name}")

    worker_stopping = [False]
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    wait_ready = getattr(worker.processor, "wait_ready", None)
    if wait_ready is not None and not wait_ready(timeout=120.0, abort=worker.stopping):
        server.stop()
        if worker.stopping.is_set():
            return 0  # stopped before it started: nothing consumed, nothing to drain
        reason = getattr(worker.processor, "not_ready_reason", "") or "no reason given"
        print(
            f"offtake: the processor container (spec.processor.container) did not become "
            f"ready: {reason}",
            file=sys.stderr,
        )
        return EXIT_FATAL
    try:
        return worker.run()
    except Exception as exc:
        log.exception("worker failed")
        print(f"offtake: worker failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FATAL
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
