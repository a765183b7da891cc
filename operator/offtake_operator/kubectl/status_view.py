"""``kubectl offtake status``: one pipeline in full, or every pipeline of the namespace in a line.

The phase, conditions, lag totals and redrive totals are the operator's (``status``, see
offtake_operator.status); per-partition positions, owners and the DLQ's size come from Kafka
when it is reachable from here, and the report says so when it is not.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from .. import names
from .cluster import JSON, Cluster
from .errors import PluginError
from .kafka_view import (
    KAFKA_TIMEOUT,
    check_reachable,
    kafka_access,
    owners,
    pipeline_spec,
    topic_size,
)
from .kafka_view import positions as group_positions

EVENTS_SHOWN = 8


def _ready_condition(st: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or []
    )


def pod_rows(pods: Sequence[Mapping[str, Any]], checksum: str | None) -> list[JSON]:
    rows = []
    for pod in pods:
        meta, st = pod.get("metadata") or {}, pod.get("status") or {}
        containers = (st.get("containerStatuses") or []) + (st.get("initContainerStatuses") or [])
        wanted = (names.WORKER_CONTAINER, names.INJECTED_CONTAINER)
        worker = next((c for c in containers if c.get("name") in wanted), None)
        running = (meta.get("annotations") or {}).get(names.CHECKSUM_ANNOTATION)
        rows.append(
            {
                "name": meta.get("name"),
                # The worker's own readiness (its /readyz); the pod's Ready before it reports.
                "ready": bool(worker.get("ready")) if worker else _ready_condition(st),
                "restarts": sum(int(c.get("restartCount") or 0) for c in containers),
                "ip": st.get("podIP"),
                # Whether the pod runs the pipeline's current configuration (None: unknown).
                "currentConfig": None if checksum is None else running == checksum,
                "terminating": bool(meta.get("deletionTimestamp")),
            }
        )
    return rows


def collect(cluster: Cluster, name: str) -> tuple[JSON, str | None]:
    """The report of one pipeline, and why Kafka could not be read from here (None if it could)."""
    manifest = cluster.pipeline(name)
    st = manifest.get("status") or {}
    spec = manifest.get("spec") or {}
    report: JSON = {
        "name": name,
        "namespace": cluster.namespace,
        "phase": st.get("phase", "Unknown"),
        "reason": st.get("reason", ""),
        "message": st.get("message", ""),
        "replicas": {
            "desired": spec.get("replicas"),
            "running": st.get("replicas", 0),
            "ready": st.get("readyReplicas", 0),
        },
        "conditions": [
            {k: c.get(k) for k in ("type", "status", "reason", "message", "lastTransitionTime")}
            for c in st.get("conditions") or []
        ],
        "lag": {"records": st.get("lag"), "seconds": st.get("lagSeconds"), "from": "status"},
        "partitions": None,
        "pods": pod_rows(cluster.pods(name), cluster.template_checksum(name)),
        "dlq": None,
        "redrive": st.get("redrive"),
        "rewind": st.get("rewind"),
        "events": cluster.events(name, EVENTS_SHOWN),
    }
    dlq_topic = ((spec.get("errors") or {}).get("dlq") or {}).get("topic")
    if dlq_topic:
        report["dlq"] = {"topic": dlq_topic, "records": None}
    try:
        access = kafka_access(cluster, pipeline_spec(manifest), KAFKA_TIMEOUT)
        admin = check_reachable(access, KAFKA_TIMEOUT)
        held = owners(admin, access.spec.source.group_id, KAFKA_TIMEOUT)
        # A member is known by its host; the pod with that IP is the one people look for.
        by_ip = {p["ip"]: p["name"] for p in report["pods"] if p["ip"]}
        held = {tp: by_ip.get(who, who) for tp, who in held.items()}
        now_ms = time.time() * 1000
        rows: list[JSON] = []
        for p in group_positions(access):
            seconds = p.lag_seconds(now_ms)
            rows.append(
                {
                    "topic": p.topic,
                    "partition": p.partition,
                    "owner": held.get((p.topic, p.partition)),
                    "committed": p.committed,
                    "logEnd": p.log_end,
                    "lag": p.lag,
                    "lagSeconds": None if seconds is None else round(seconds, 1),
                }
            )
        report["partitions"] = rows
        report["lag"] = {
            "records": sum(r["lag"] for r in rows),
            "seconds": max((float(r["lagSeconds"] or 0.0) for r in rows), default=0.0),
            "from": "kafka",
        }
        if dlq_topic:
            report["dlq"]["records"] = topic_size(admin, dlq_topic, access, KAFKA_TIMEOUT)
    except PluginError as exc:
        return report, str(exc)
    return report, None


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def render(report: Mapping[str, Any], kafka_error: str | None) -> str:
    r = report["replicas"]
    lines = [
        f"ConsumerPipeline {report['namespace']}/{report['name']}: {report['phase']}"
        f" ({report['reason']}) {report['message']}",
        f"workers: {r['ready']}/{_cell(r['desired'])} ready, {r['running']} running",
    ]
    lag = report["lag"]
    lines.append(
        f"lag: {_cell(lag['records'])} records, {_cell(lag['seconds'])} s (from {lag['from']})"
    )
    lines.append("conditions:")
    for c in report["conditions"]:
        lines.append(f"  {c['type']:<12} {c['status']:<6} {c['reason']}: {c['message']}")
    if kafka_error is not None:
        lines.append(
            f"kafka: {kafka_error}; partitions, owners and the DLQ size are not shown "
            "(everything else comes from the API server)"
        )
    if report["partitions"] is not None:
        rows = report["partitions"]
        tw = max([5, *(len(p["topic"]) for p in rows)])
        ow = max([5, *(len(_cell(p["owner"])) for p in rows)])
        lines.append(
            f"{'TOPIC':<{tw}} {'PART':>4} {'OWNER':<{ow}} {'COMMITTED':>10} {'LOG END':>10} "
            f"{'LAG':>8} {'LAG(S)':>7}"
        )
        for p in rows:
            lines.append(
                f"{p['topic']:<{tw}} {p['partition']:>4} {_cell(p['owner']):<{ow}} "
                f"{_cell(p['committed']):>10} {p['logEnd']:>10} {p['lag']:>8} "
                f"{_cell(p['lagSeconds']):>7}"
            )
    lines.append("pods:" if report["pods"] else "pods: none")
    for pod in report["pods"]:
        current = {None: "?", True: "current", False: "OLD CONFIG"}[pod["currentConfig"]]
        state = "ready" if pod["ready"] else "not ready"
        gone = " terminating" if pod["terminating"] else ""
        lines.append(f"  {pod['name']:<40} {state:<9} restarts {pod['restarts']}  {current}{gone}")
    dlq = report["dlq"]
    if dlq is not None:
        lines.append(f"dead letters: {_cell(dlq['records'])} in {dlq['topic']}")
    redrive = report["redrive"]
    if redrive:
        lines.append(
            "last redrive: "
            + ", ".join(
                f"{k} {redrive[k]}"
                for k in ("lastId", "activeId", "replayed", "left", "skipped", "message")
                if k in redrive
            )
        )
    lines.append("events:" if report["events"] else "events: none")
    for e in report["events"]:
        lines.append(f"  {e['time']} {e['type']:<7} {e['reason']}: {e['message']}")
    return "\n".join(lines)


def summary_line(manifest: Mapping[str, Any]) -> JSON:
    st = manifest.get("status") or {}
    return {
        "name": manifest["metadata"]["name"],
        "phase": st.get("phase", "Unknown"),
        "ready": f"{st.get('readyReplicas', 0)}/{(manifest.get('spec') or {}).get('replicas', 1)}",
        "lag": st.get("lag"),
        "lagSeconds": st.get("lagSeconds"),
        "reason": st.get("reason", ""),
        "message": st.get("message", ""),
    }


def render_summaries(rows: Sequence[Mapping[str, Any]], namespace: str) -> str:
    if not rows:
        return f"no ConsumerPipelines in namespace {namespace}"
    lines = [f"{'NAME':<28} {'PHASE':<9} {'READY':<6} {'LAG':>8} {'LAG(S)':>7}  REASON  MESSAGE"]
    for r in rows:
        lines.append(
            f"{r['name']:<28} {r['phase']:<9} {r['ready']:<6} {_cell(r['lag']):>8} "
            f"{_cell(r['lagSeconds']):>7}  {r['reason']}  {r['message']}"
        )
    return "\n".join(lines)
