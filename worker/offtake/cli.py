"""``offtake worker --pipeline FILE``: the process every ConsumerPipeline pod runs.

Exit codes: 0 graceful stop; 1 stopped by errors.policy=stop; 2 invalid manifest or
configuration; 3 fatal Kafka or internal error; 14 the shutdown watchdog ended a worker whose
Kafka client did not return (offtake.engine.watchdog); 128+N when a second signal N forced the
exit.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import socket
import sys
import threading
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING, Any

from offtake.stop_signals import StopSignals

if TYPE_CHECKING:
    from collections.abc import Callable

    from offtake.config import PipelineSpec
    from offtake.engine.worker import Worker
    from offtake.health import Health, MetricsServer
    from offtake.metrics import Metrics

# Nothing slow is imported above (offtake.config brings yaml and the spec): `offtake worker`
# takes SIGTERM from its first moment (offtake.stop_signals); each command imports what it uses.

EXIT_CONFIG = 2
GC_YOUNG_THRESHOLD = 10_000  # allocations between young collections (Python's default: 700)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("offtake")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    # Before the manifest is read: a pod may be stopped at any moment of its start.
    signals = StopSignals().install() if words[:1] == ["worker"] else None
    args = _parser().parse_args(argv)
    if args.command == "drain":
        return _drain(args.port, args.timeout)
    if args.command == "spark-archive":
        return _spark_archive(args.dir, args.force)
    if args.command == "redrive":
        return _redrive(args)
    if args.command == "validate":
        return _validate(args.pipeline)
    if args.command == "status":
        return _status(args)
    return _worker(args, signals or StopSignals().install())


def _parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per job (worker, validate, status, redrive, ...)."""
    parser = argparse.ArgumentParser(
        prog="offtake", description="Kafka consumer pipelines done right."
    )
    parser.add_argument("--version", action="version", version=f"offtake {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _worker_options(sub)
    v = sub.add_parser("validate", help="check a ConsumerPipeline manifest and print the result")
    v.add_argument("pipeline")
    s = sub.add_parser(
        "status", help="per-partition committed offset and lag of a pipeline's consumer group"
    )
    s.add_argument("--pipeline", required=True, help="path of the ConsumerPipeline manifest")
    s.add_argument("--metrics", help="a running worker's metrics (host:port): in-flight, paused")
    s.add_argument("--once", action="store_true", help="print once instead of refreshing")
    s.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    _redrive_options(sub)
    a = sub.add_parser(
        "spark-archive",
        help="make the class-data archive that halves a local Spark session's start",
        description="Run a short local Spark session and keep the classes its JVM loaded in an "
        "archive, which every later local session of sink.spark maps (docs/spark-sink.md). Needs "
        "java and pyspark (the worker-spark image, or pip install 'offtake[spark]').",
    )
    a.add_argument(
        "--dir",
        help="where to write it (default $OFFTAKE_SPARK_ARCHIVES, else "
        "$OFFTAKE_CACHE/spark-archives, else ~/.cache/offtake/spark-archives)",
    )
    a.add_argument(
        "--force", action="store_true", help="make it again even if one for this JVM exists"
    )
    d = sub.add_parser(
        "drain",
        help="drain the worker of this pod (GET /drain on 127.0.0.1) and wait until it has",
        description="Ask the worker serving on --port of this host (this pod) to stop "
        "consuming, deliver and commit what is in flight and leave its group; exit 0 once it "
        "has. The worker serves /drain to loopback and its node only (docs/operator.md).",
    )
    d.add_argument("--port", type=int, required=True, help="the worker's spec.metrics.port")
    d.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the answer")
    return parser


def _worker_options(sub: Any) -> None:
    w = sub.add_parser("worker", help="run the worker of one ConsumerPipeline manifest")
    w.add_argument("--pipeline", required=True, help="path of the ConsumerPipeline manifest (YAML)")
    w.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics, /healthz, /readyz here (default spec.metrics.port; 0: any free port)",
    )
    w.add_argument(
        "--probe-port",
        type=int,
        default=None,
        help="also serve /healthz and /readyz, and nothing else, on this port with connections of "
        "its own: the kubelet's probes (the operator passes spec.metrics.probePort); default none",
    )
    w.add_argument("--log-level", default=None, help="default $OFFTAKE_LOG_LEVEL, else INFO")
    w.add_argument(
        "--instance-id",
        default=None,
        help="static group membership (group.instance.id); default $OFFTAKE_GROUP_INSTANCE_ID, "
        "or the pod name ($POD_NAME, else the host name) when spec.kafka.staticMembership or "
        "$OFFTAKE_STATIC_MEMBERSHIP is true",
    )


def _redrive_options(sub: Any) -> None:
    r = sub.add_parser(
        "redrive",
        help="replay a pipeline's dead letters into its source topics, once per id",
        description="Replay the dead letters of --from (default: the pipeline's "
        "errors.dlq.topic) stamped at or before --until to the topics they came from. Progress "
        "is committed to the group --group (default <groupId>.redrive): a rerun resumes, the "
        "next redrive starts where this one stopped, nothing is replayed twice.",
    )
    r.add_argument("--pipeline", required=True, help="path of the ConsumerPipeline manifest")
    r.add_argument("--from", dest="source", help="the dead-letter topic (default errors.dlq.topic)")
    r.add_argument("--until", required=True, help="RFC 3339: dead letters stamped later are left")
    r.add_argument("--id", help="the redrive's id (default: derived from --until)")
    r.add_argument(
        "--group", help="consumer group recording progress (default <groupId>.redrive.<id>)"
    )
    r.add_argument("--log-level", default=None, help="default $OFFTAKE_LOG_LEVEL, else INFO")


def _drain(port: int, timeout: float) -> int:
    """Exit 0 when the worker answered drained; 1 with its answer (or why none came)."""
    import urllib.error
    import urllib.request

    url = f"http://127.0.0.1:{port}/drain"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            print(answer.read().decode(errors="replace").strip())
            return 0
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace").strip()
        print(f"offtake: drain refused by {url}: {exc.code} {body}", file=sys.stderr)
    except OSError as exc:
        print(f"offtake: cannot reach the worker at {url}: {exc}", file=sys.stderr)
    return 1


def setup_logging(given: str | None, pipeline: str, stream: IO[str] | None = None) -> None:
    """The JSON logging, at ``--log-level``, else $OFFTAKE_LOG_LEVEL, else INFO (docs/metrics.md):
    the environment is read here, at the edge; offtake.logs takes the value."""
    from offtake.logs import ENV_LEVEL, configure_logging

    if given:
        configure_logging(given, pipeline, stream, origin="--log-level")
    else:
        configure_logging(os.environ.get(ENV_LEVEL), pipeline, stream, origin=f"${ENV_LEVEL}")


def _spark_archive(directory: str | None, force: bool) -> int:
    """Exit 0 printing the archive's path; 3 when it could not be made, saying why."""
    from pathlib import Path

    setup_logging(None, "spark-archive")
    try:
        from offtake.sinks.spark.archive_training import ArchiveError, make_archive

        path = make_archive(Path(directory) if directory else None, force=force)
    except ImportError as exc:
        print(f"offtake spark-archive: needs pyspark: {exc}", file=sys.stderr)
        return 3
    except ArchiveError as exc:
        print(f"offtake spark-archive: {exc}", file=sys.stderr)
        return 3
    except Exception as exc:  # Spark did not start (Py4JError, RuntimeError): say so plainly
        print(f"offtake spark-archive: the training session failed: {exc}", file=sys.stderr)
        return 3
    print(path)
    return 0


def _status(args: argparse.Namespace) -> int:
    from offtake import status
    from offtake.config import ConfigError, load_pipeline

    try:
        spec = load_pipeline(args.pipeline)
    except ConfigError as exc:
        print(f"offtake: invalid pipeline manifest: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        return status.run(
            spec, args.metrics, args.once, args.interval, lambda t: print(t, end="", flush=True)
        )
    except KeyboardInterrupt:
        return 0
    except (LookupError, OSError) as exc:
        print(f"offtake status: {exc}", file=sys.stderr)
        return 3
    except Exception as exc:  # KafkaException: brokers unreachable, group not authorised
        print(f"offtake status: cannot read the group from Kafka: {exc}", file=sys.stderr)
        return 3


def _redrive(args: argparse.Namespace) -> int:
    """Exit 0 with a JSON summary on stdout; 2 for bad input (naming the option), 3 for Kafka."""
    import json

    from offtake.config import ConfigError, load_pipeline, parse_until, redrive_group
    from offtake.config.redrive import parse_redrive

    try:
        spec = load_pipeline(args.pipeline)
        until = parse_until(args.until, "--until")
        rid = args.id or until.strftime("until-%Y%m%dT%H%M%SZ")
        dlq = spec.errors.dlq.topic if spec.errors.dlq is not None else None
        raw = {"id": rid, "until": args.until}
        if args.source:
            raw["from"] = args.source
        request = parse_redrive(raw, dlq)
    except ConfigError as exc:
        message = str(exc).replace("spec.redrive.from:", "--from:").replace("spec.redrive.", "--")
        print(f"offtake redrive: {message}", file=sys.stderr)
        return EXIT_CONFIG
    assert request is not None
    setup_logging(args.log_level, spec.name)
    from offtake.redrive import RedriveError, redrive

    group = args.group or redrive_group(spec.source.group_id)
    try:
        result = redrive(spec, request, group)
    except RedriveError as exc:
        print(
            f"offtake redrive: {str(exc).replace('spec.redrive.from:', '--from:')}", file=sys.stderr
        )
        return EXIT_CONFIG
    except Exception as exc:  # KafkaException: brokers unreachable, not authorised
        print(f"offtake redrive: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 3
    print(json.dumps(result.summary(request)), flush=True)
    return 0


def group_instance_id(spec: PipelineSpec, given: str | None) -> str | None:
    """The worker's group.instance.id: ``--instance-id``, else $OFFTAKE_GROUP_INSTANCE_ID, else
    the pod's name when static membership is on (spec.kafka.staticMembership or
    $OFFTAKE_STATIC_MEMBERSHIP), else None.

    Static membership is opt-in: a static member keeps its partitions after it stops. The pod's
    name is the downward API's $POD_NAME (the operator sets it), else the host name, which in a
    pod is the pod's name.
    """
    explicit = given or os.environ.get("OFFTAKE_GROUP_INSTANCE_ID")
    if explicit:
        return explicit
    from_env = os.environ.get("OFFTAKE_STATIC_MEMBERSHIP", "").lower() in ("1", "true", "yes")
    if spec.kafka.static_membership or from_env:
        return os.environ.get("POD_NAME") or socket.gethostname()
    return None


def _validate(path: str) -> int:
    """Check offline all that can be: the CRD's schema and CEL rules (what the API server will
    say), the worker's own checks, and the processing function's import. Report every problem."""
    from offtake.config import ConfigError, parse_pipeline, read_manifest
    from offtake.config.crd_check import crd_problems
    from offtake.processing.function import FunctionLoadError, load_function

    try:
        doc = read_manifest(path)
    except ConfigError as exc:
        print(f"offtake: invalid pipeline manifest: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    problems: list[str] = []
    spec: PipelineSpec | None = None
    try:
        spec = parse_pipeline(doc)
    except ConfigError as exc:
        problems.append(str(exc))
    # The loader's message is the more specific one where both name the same field.
    reported = {p.split(": ", 1)[0] for p in problems}
    problems += [p for p in crd_problems(doc) if p.split(": ", 1)[0] not in reported]
    function = _processor_function(doc)
    if function is not None:
        try:
            load_function(function)
        except FunctionLoadError as exc:
            problems.append(str(exc))
    if problems:
        print(
            f"offtake: invalid pipeline manifest {path}: {len(problems)} problem(s)",
            file=sys.stderr,
        )
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return EXIT_CONFIG
    assert spec is not None
    print(f"{path}: ok (pipeline {spec.namespace}/{spec.name}, sink {spec.sink.kind})")
    if (note := _function_note(spec)) is not None:
        print(f"  {note}")
    if spec.source.is_share_group:
        print(
            f"  source.groupType share: queue mode on share group {spec.source.group_id} "
            "(Kafka 4.2+, client API in Preview): records, not partitions, are shared out; "
            "no per-key order (docs/queue-mode.md)"
        )
        for warning in _lock_warnings(spec):
            print(f"  {warning}")
    return 0


def _lock_warnings(spec: PipelineSpec) -> list[str]:
    """Queue mode: calls allowed longer than a record's acquisition lock leaves them."""
    from offtake.kafka.share_source import call_outlives_lock

    p = spec.processor
    timeouts = [("processor.timeoutSeconds", p.timeout_seconds)]
    if p.container is not None:
        timeouts.append(("processor.container.timeoutSeconds", p.container.timeout_seconds))
    return [
        warning
        for where, seconds in timeouts
        if seconds is not None and (warning := call_outlives_lock(seconds, where)) is not None
    ]


def _function_note(spec: PipelineSpec) -> str | None:
    """Where processor.function will run and what bounds a call: the defaults users rely on."""
    p = spec.processor
    if p.function is None:
        return None
    if not p.in_processes:
        return (
            f"processor.function {p.function} runs in the worker's thread: no timeoutSeconds "
            "(a call that hangs holds its partition) and no maxMemoryMiB (a leak ends with the "
            "pod's memory limit; the restarted worker resumes from its last commit)"
        )
    bounds = [
        f"timeoutSeconds {p.timeout_seconds:g} (a call past it is killed: that record's error)"
        if p.timeout_seconds is not None
        else "no timeoutSeconds",
        f"maxMemoryMiB {p.max_memory_mib} (a process past it is replaced between calls)"
        if p.max_memory_mib is not None
        else "no maxMemoryMiB",
    ]
    return (
        f"processor.function {p.function} runs in {p.parallelism} pool process(es): "
        + ", ".join(bounds)
    )


def _processor_function(doc: Mapping[str, Any]) -> str | None:
    """spec.processor.function as written, even when other fields are invalid."""
    spec = doc.get("spec")
    processor = spec.get("processor") if isinstance(spec, Mapping) else None
    function = processor.get("function") if isinstance(processor, Mapping) else None
    return function if isinstance(function, str) else None


def _tune_gc() -> None:
    """Keep the cyclic garbage collector off the per-record path of a running worker.

    Every record makes a few short-lived containers (its Record, decoded value, tuples), and
    the records in flight live long enough to be promoted: with the default thresholds the
    collector ran every 700 allocations and kept walking the start-up heap (the imported
    modules, the schema registry client's). Freezing that heap and collecting the young
    generation every 10,000 allocations cut about 1 us of CPU per JSON record (docs/bench.md).
    Cycles are still collected, only in larger steps.
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD)  # the older generations keep their defaults


def _worker(args: argparse.Namespace, signals: StopSignals) -> int:
    from offtake.config import ConfigError, load_pipeline

    try:
        spec = load_pipeline(args.pipeline)
    except ConfigError as exc:
        print(f"offtake: invalid pipeline manifest: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(args.log_level, spec.name)
    log = logging.getLogger("offtake.cli")
    if signals.received is not None:
        return _stopped_starting(log, signals, "before building the pipeline", None)

    from offtake.engine.exit_codes import EXIT_FATAL
    from offtake.kafka.share_source import ShareGroupUnavailable
    from offtake.sinks.base import SinkError

    instance_id = group_instance_id(spec, args.instance_id)
    built = _build_worker(spec, instance_id)
    if isinstance(built, int):
        return built
    worker, metrics, health = built
    signals.forward_to(worker.stop)  # a signal that came meanwhile stops it now
    if worker.stopping.is_set():
        return _stopped_starting(log, signals, "while building the pipeline", worker)
    port = spec.metrics.port if args.metrics_port is None else args.metrics_port
    drain_requested = threading.Event()
    drain_budget = float(spec.shutdown.drain_timeout_seconds) + 15.0

    def drain() -> tuple[bool, str]:
        drain_requested.set()
        worker.stop("drain requested (the application container is stopping)")
        # signals.finished: worker.run() returned (drained, committed, out of the group).
        if signals.finished.wait(drain_budget):
            return True, "drained"
        return False, f"still draining after {drain_budget:.0f} s"

    servers = _servers(metrics, health, port, args.probe_port, drain)
    if isinstance(servers, int):
        return servers
    server, probes = servers
    log.info("metrics, /healthz and /readyz on port %d", server.port)
    try:
        not_started = _wait_to_start(spec, instance_id, worker, signals, log)
        if not_started is not None:
            return not_started
        _tune_gc()
        # From here a stop before the first assignment is the worker's own graceful stop: it
        # leaves the group having consumed nothing, and says so (Worker._shutdown).
        code = worker.run()
        signals.finished.set()
        if drain_requested.is_set() and not signals.signalled.is_set():
            # Drained through /drain while the pod terminates: a native sidecar that exits is
            # restarted, so stay (idle, out of the group) until the kubelet's SIGTERM.
            log.info("drained on request; waiting for SIGTERM")
            signals.signalled.wait()
        return code
    # A share group the broker does not serve (the message names spec.source.groupType) or a
    # sink that refused to start (its message says why): one line, no traceback.
    except (ShareGroupUnavailable, SinkError) as exc:
        log.error("%s", exc)
        print(f"offtake: {exc}", file=sys.stderr)
        return EXIT_FATAL
    except Exception as exc:
        log.exception("worker failed")
        print(f"offtake: worker failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FATAL
    finally:
        signals.finished.set()  # a signal from now on only ends the process's last waits
        server.stop()
        if probes is not None:
            probes.stop()


def _build_worker(
    spec: PipelineSpec, instance_id: str | None
) -> tuple[Worker, Metrics, Health] | int:
    """The worker of ``spec``, its metrics and health; EXIT_CONFIG (said on stderr) when a part
    the spec names cannot be built (the processing function's import, say)."""
    from offtake.config import ConfigError
    from offtake.engine import watchdog
    from offtake.engine.assembly import build_worker
    from offtake.health import Health
    from offtake.metrics import Metrics
    from offtake.processing.function import FunctionLoadError

    watchdog.enable()  # a worker process of its own: its shutdown may end it (see watchdog)
    metrics = Metrics(spec.name)
    max_poll_ms = float(spec.kafka.config.get("max.poll.interval.ms", 300_000))
    health = Health(max_poll_interval_s=max_poll_ms / 1000)
    try:
        worker = build_worker(
            spec,
            metrics=metrics,
            health=health,
            instance_id=instance_id,
            pod_name=os.environ.get("POD_NAME"),  # the downward API's, read here at the edge
        )
    except (FunctionLoadError, ConfigError, ValueError) as exc:
        print(f"offtake: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return worker, metrics, health


def _servers(
    metrics: Metrics,
    health: Health,
    port: int,
    probe_port: int | None,
    drain: Callable[[], tuple[bool, str]],
) -> tuple[MetricsServer, MetricsServer | None] | int:
    """The metrics server (with /drain for an injected worker) and the probes' own, started;
    or EXIT_CONFIG, said on stderr, when a port cannot be bound."""
    from offtake.health import DRAIN_ENV, NODE_IPS_ENV, MetricsServer, node_addresses

    # /drain only for an injected worker (the operator sets the variable): from the pod itself
    # or its node's kubelet running the application's preStop hook, never from elsewhere.
    drains = bool(os.environ.get(DRAIN_ENV))
    server = MetricsServer(
        metrics,
        health,
        port,
        drain=drain if drains else None,
        drain_from=node_addresses(os.environ.get(NODE_IPS_ENV, "")) if drains else (),
    )
    # The kubelet's probes on a port of their own: clients that fill the metrics port's
    # connection slots never make a probe fail (offtake.health, docs/security.md).
    probes = (
        None if probe_port is None else MetricsServer(metrics, health, probe_port, probes_only=True)
    )
    try:
        server.start()
        if probes is not None:
            probes.start()
    except OSError as exc:
        server.stop()
        # MetricsServer's message names the port and its field; strerror is that message.
        print(f"offtake: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_CONFIG
    return server, probes


def _wait_to_start(
    spec: PipelineSpec,
    instance_id: str | None,
    worker: Worker,
    signals: StopSignals,
    log: logging.Logger,
) -> int | None:
    """Kafka reachable, the retry topics there, the processor container ready: None, or the
    exit code (0 for a stop that came meanwhile, EXIT_FATAL said in the log)."""
    from offtake.engine.exit_codes import EXIT_FATAL
    from offtake.kafka.start_checks import reach_kafka, retry_topics_exist

    if not reach_kafka(spec, instance_id, worker.stopping, log):
        if worker.stopping.is_set():
            return _stopped_starting(log, signals, "while waiting for Kafka", worker)
        return EXIT_FATAL
    if not retry_topics_exist(spec, instance_id, log):
        return EXIT_FATAL
    wait_ready = getattr(worker.processor, "wait_ready", None)
    if wait_ready is not None and not wait_ready(timeout=120.0, abort=worker.stopping):
        if worker.stopping.is_set():
            return _stopped_starting(
                log, signals, "while waiting for the processor container", worker
            )
        reason = getattr(worker.processor, "not_ready_reason", "") or "no reason given"
        print(
            f"offtake: the processor container (spec.processor.container) did not become "
            f"ready: {reason}",
            file=sys.stderr,
        )
        return EXIT_FATAL
    if worker.stopping.is_set():
        return _stopped_starting(log, signals, "before joining the group", worker)
    return None


def _stopped_starting(log: logging.Logger, signals: StopSignals, when: str, worker: Any) -> int:
    """A stop (a signal, or /drain) came during start-up: exit 0, nothing consumed or committed.

    The consumer never subscribed, so there is nothing to drain or commit and no group to
    leave; the parts already built (the processor's pool or sidecar client, the sink) close.
    """
    reason = signals.reason or "stop requested"  # no signal: /drain asked for it
    log.info(
        "%s %s: exiting before the first assignment, nothing consumed, nothing committed "
        "(exit code 0)",
        reason,
        when,
    )
    if worker is not None:
        for close in (worker.processor.close, worker.sink.close):
            try:
                close()
            except Exception as exc:  # exiting anyway: say what did not close cleanly
                log.warning("closing after a stop during start-up: %s", exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
