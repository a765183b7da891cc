"""``kubectl offtake``: the command line (the console script ``kubectl-offtake``).

kubectl hands a plugin every argument after its name, so the plugin reads kubectl's own
connection flags itself: ``--kubeconfig``, ``--context``, ``-n/--namespace``, before or after
the command. Exit codes: 0 done; 1 a refused or failed request; 2 a command line it cannot read;
3 no cluster reachable or configured; 4 the CRD is not installed; 5 no such pipeline; 6 Kafka
not reachable from here (``status`` still prints what the API server knows); 7 the operator
did not finish in time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, TextIO

import yaml

from . import actions, dlq, logs, report, status_view
from .cluster import Cluster, Target
from .errors import KafkaUnreachableError, PluginError
from .kafka_view import KAFKA_TIMEOUT, check_reachable, kafka_access, pipeline_spec
from .terminal import Safe

_DURATION = re.compile(r"([0-9]+)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str) -> int:
    """``--since``: a duration (``90s``, ``15m``, ``2h``, ``1d``) or an RFC 3339 time; epoch ms."""
    found = _DURATION.fullmatch(text)
    if found:
        return int((time.time() - int(found.group(1)) * _UNITS[found.group(2)]) * 1000)
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--since {text!r}: expected a duration (90s, 15m, 2h, 1d) or an RFC 3339 time "
            "(2026-05-01T12:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


def _seconds(text: str) -> int:
    found = _DURATION.fullmatch(text)
    if not found:
        raise argparse.ArgumentTypeError(f"--since {text!r}: expected 90s, 15m, 2h or 1d")
    return int(found.group(1)) * _UNITS[found.group(2)]


def _regex(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(
            f"--grep {text!r}: not a regular expression: {exc}"
        ) from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def _connection_flags(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: the same flags before and after the command, the later one not erasing the first.
    p.add_argument("--kubeconfig", default=argparse.SUPPRESS, help="path of the kubeconfig")
    p.add_argument("--context", default=argparse.SUPPRESS, help="the kubeconfig context")
    p.add_argument(
        "-n", "--namespace", default=argparse.SUPPRESS, help="namespace (default: the context's)"
    )


def _follow_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to follow (default 300)")
    p.add_argument("--no-wait", action="store_true", help="change the spec and return")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="kubectl offtake",
        description="Operate Offtake ConsumerPipelines: status, dead letters, logs, support "
        "bundles; pause, resume, scale, rewind, redrive.",
    )
    _connection_flags(top)
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("status", help="a pipeline in full, or every pipeline of the namespace")
    s.add_argument("name", nargs="?", help="the pipeline (default: all, one line each)")
    s.add_argument("-o", "--output", choices=["text", "json", "yaml"], default="text")
    s.add_argument("-w", "--watch", action="store_true", help="refresh until Ctrl-C")
    s.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")

    d = sub.add_parser("dlq", help="list a pipeline's dead letters, newest first")
    d.add_argument("name")
    d.add_argument("--limit", type=_positive, default=20, help="at most this many (default 20)")
    d.add_argument("--since", type=parse_since, help="only newer: 15m, 2h, 1d or an RFC 3339 time")
    d.add_argument("--grep", type=_regex, help="only those matching this regular expression")
    d.add_argument("-o", "--output", choices=["text", "json"], default="text")
    d.add_argument(
        "--import",
        dest="import_modules",
        action="store_true",
        help="decode Protobuf with the module spec.source.protobufMessage names (imports, "
        "so runs, it here; default: raw fields)",
    )

    lg = sub.add_parser("logs", help="every worker's JSON log, merged by time")
    lg.add_argument("name")
    lg.add_argument("--tail", type=_positive, default=100, help="lines per pod (default 100)")
    lg.add_argument("--since", type=_seconds, help="only newer: 90s, 15m, 2h, 1d")
    lg.add_argument("--level", choices=logs.LEVELS, default="DEBUG", help="at least this level")
    lg.add_argument("-o", "--output", choices=["text", "json"], default="text")

    rp = sub.add_parser("report", help="a support bundle (zip) without any Secret value")
    rp.add_argument("name")
    rp.add_argument("-f", "--file", help="where (default offtake-report-NS-NAME-TIME.zip)")

    for verb, text in (("pause", "drain and stop the workers"), ("resume", "start them again")):
        p = sub.add_parser(verb, help=f"{text} (spec.paused), then follow")
        p.add_argument("name")
        _follow_flags(p)
    sc = sub.add_parser("scale", help="set the worker count (the scale subresource), then follow")
    sc.add_argument("name")
    sc.add_argument("replicas", type=_positive)
    _follow_flags(sc)
    rw = sub.add_parser("rewind", help="reset the group's offsets (spec.rewind), then follow")
    rw.add_argument("name")
    rw.add_argument("--to", choices=["earliest", "latest", "timestamp"], required=True)
    rw.add_argument("--timestamp", help="RFC 3339, with --to timestamp")
    rw.add_argument("--id", help="the rewind's id (default: a new one)")
    _follow_flags(rw)
    rd = sub.add_parser("redrive", help="replay dead letters (spec.redrive), then follow")
    rd.add_argument("name")
    rd.add_argument("--until", help="dead letters stamped at or before (default: now)")
    rd.add_argument("--from", dest="source", help="the dead-letter topic (default errors.dlq)")
    rd.add_argument("--id", help="the redrive's id (default: a new one)")
    _follow_flags(rd)
    for p in (s, d, lg, rp, sc, rw, rd, *(sub.choices[v] for v in ("pause", "resume"))):
        _connection_flags(p)
    return top


def _new_id(verb: str) -> str:
    return f"{verb}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:4]}"


def _status(cluster: Cluster, args: argparse.Namespace, out: Safe, err: Safe) -> int:
    if not args.watch:
        return _status_once(cluster, args, out, err)
    code = 0
    try:
        while True:
            # A terminal is cleared and redrawn; a pipe gets each refresh after a stamped rule.
            if out.isatty():
                out.control("\x1b[H\x1b[2J")
            else:
                out.write(f"--- {time.strftime('%H:%M:%S')}\n")
            code = _status_once(cluster, args, out, err)
            out.flush()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return code  # Ctrl-C is how a watch ends


def _status_once(cluster: Cluster, args: argparse.Namespace, out: Safe, err: Safe) -> int:
    if args.name is None:
        rows = [status_view.summary_line(m) for m in cluster.pipelines()]
        if args.output == "text":
            out.write(status_view.render_summaries(rows, cluster.namespace) + "\n")
        else:
            _dump(out, {"namespace": cluster.namespace, "pipelines": rows}, args.output)
        return 0
    report, kafka_error = status_view.collect(cluster, args.name)
    if args.output == "text":
        out.write(status_view.render(report, kafka_error) + "\n")
    else:
        _dump(out, {**report, "kafkaError": kafka_error}, args.output)
    if kafka_error is not None:
        err.write(f"kubectl offtake: {kafka_error}\n")
        return KafkaUnreachableError.exit_code
    return 0


def _dump(out: Safe, value: Any, fmt: str) -> None:
    if fmt == "json":
        out.write(json.dumps(value, indent=2, default=str) + "\n")
    else:
        out.write(yaml.safe_dump(value, sort_keys=False))


def _dlq(cluster: Cluster, args: argparse.Namespace, out: Safe) -> int:
    manifest = cluster.pipeline(args.name)
    spec = pipeline_spec(manifest)
    topic = spec.errors.dlq.topic if spec.errors.dlq is not None else None
    if topic is None:
        raise PluginError(
            f"ConsumerPipeline {args.name!r} has no dead-letter topic (spec.errors.dlq.topic)"
        )
    access = kafka_access(cluster, spec, KAFKA_TIMEOUT)
    try:
        check_reachable(access, KAFKA_TIMEOUT)
    except KafkaUnreachableError as exc:
        raise KafkaUnreachableError(
            f"{exc}; dead letters need Kafka (status, pause, resume, scale, rewind and redrive "
            "work through the API server)"
        ) from None
    query = dlq.Query(args.limit, args.since, args.grep, args.import_modules)
    letters = dlq.read(access, topic, query, KAFKA_TIMEOUT * 2)
    if args.output == "json":
        out.write(json.dumps(letters, indent=2, default=str) + "\n")
    else:
        out.write(dlq.render(letters, topic) + "\n")
    return 0


def _logs(cluster: Cluster, args: argparse.Namespace, out: Safe, err: Safe) -> int:
    cluster.pipeline(args.name)
    pods = cluster.pods(args.name)
    if not pods:
        out.write(f"no worker pods of {args.name} (paused, or not started yet)\n")
        return 0
    texts: dict[str, list[str]] = {}
    missing: list[str] = []
    for pod in pods:
        pod_name = pod["metadata"]["name"]
        try:
            text = cluster.worker_log(pod, args.tail, args.since)
        except PluginError as exc:
            # One pod's log out of reach (no node serves it): say so, show the others.
            err.write(f"kubectl offtake logs: {exc}\n")
            missing.append(pod_name)
            continue
        texts[pod_name] = text.splitlines()
    merged = logs.merge(texts, args.level)
    if args.output == "json":
        out.write("".join(json.dumps(e, default=str) + "\n" for e in merged))
    elif merged:
        out.write(logs.render(merged) + "\n")
    elif texts:
        out.write(f"no log lines from {len(texts)} pod(s) at level {args.level} or above\n")
    return 1 if missing and not texts else 0


def _report(cluster: Cluster, args: argparse.Namespace, out: Safe) -> int:
    path, listed = report.write(cluster, args.name, args.file)
    out.write(f"wrote {path} ({len(listed)} files: {', '.join(listed)})\n")
    return 0


def _change(cluster: Cluster, args: argparse.Namespace, out: Safe) -> int:
    name = args.name
    goal: actions.Goal
    if args.command == "pause":
        goal = actions.pause(cluster, name)
    elif args.command == "resume":
        goal = actions.resume(cluster, name)
    elif args.command == "scale":
        goal = actions.scale(cluster, name, args.replicas)
    elif args.command == "rewind":
        if (args.to == "timestamp") != (args.timestamp is not None):
            raise PluginError("rewind: --timestamp goes with --to timestamp, and only with it")
        goal = actions.rewind(cluster, name, args.id or _new_id("rewind"), args.to, args.timestamp)
    else:
        until = args.until or datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        goal = actions.redrive(cluster, name, args.id or _new_id("redrive"), until, args.source)
    out.write(f"consumerpipeline/{name} patched: waiting until {goal.what}\n")
    out.flush()
    if args.no_wait:
        return 0
    actions.follow(cluster, name, goal, args.timeout, 1.0, _writer(out))
    return 0


def _writer(out: Safe) -> Callable[[str], None]:
    def write(text: str) -> None:
        out.write(text)
        out.flush()

    return write


def main(
    argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    # Every byte to the terminal goes through Safe: no control character from data reaches it.
    safe_out, safe_err = Safe(out or sys.stdout), Safe(err or sys.stderr)
    args = parser().parse_args(argv)
    target = Target(
        getattr(args, "kubeconfig", None),
        getattr(args, "context", None),
        getattr(args, "namespace", None),
    )
    try:
        cluster = Cluster(target)
        if args.command == "status":
            return _status(cluster, args, safe_out, safe_err)
        if args.command == "dlq":
            return _dlq(cluster, args, safe_out)
        if args.command == "logs":
            return _logs(cluster, args, safe_out, safe_err)
        if args.command == "report":
            return _report(cluster, args, safe_out)
        return _change(cluster, args, safe_out)
    except PluginError as exc:
        safe_err.write(f"kubectl offtake {args.command}: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        safe_err.write("kubectl offtake: interrupted (any change already made stays)\n")
        return 130
