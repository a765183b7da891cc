"""``kubectl offtake status``: one pipeline in full, or every pipeline of the namespace in a line.

The phase, conditions, lag totals and redrive totals are the operator's (``status``, see
offtake_operator.status); per-partition positions, owners and the DLQ's size come from Kafka
when it is reachable from here, and the report says so when it is not. The lag's trend and
the error counts behind the SLO burn come from the workers' own /metrics (worker_metrics);
without Kafka, their per-partition lag stands in for the broker's. So do, when
``processor.concurrency`` is above 1, the calls in flight, the records waiting behind a busy key
and the oldest call's age.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka.admin import AdminClient

from .. import names
from . import worker_metrics
from .cluster import JSON, Cluster
from .errors import PluginError
from .kafka_view import (
    KAFKA_TIMEOUT,
    KafkaAccess,
    check_reachable,
    kafka_access,
    owners,
    pipeline_spec,
    topic_size,
)
from .kafka_view import positions as group_positions
from .terminal import one_line

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
    pods = cluster.pods(name)
    scraped = worker_metrics.scrape(cluster, pods)
    report: JSON = {
        "name": name,
        "namespace": cluster.namespace,
        "phase": st.get("phase", "Unknown"),
        "reason": st.get("reason", ""),
        "message": st.get("message", ""),
        # consumer | share (queue mode); the CRD's default when the manifest leaves it out.
        "groupType": (spec.get("source") or {}).get("groupType", "consumer"),
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
        "pods": pod_rows(pods, cluster.template_checksum(name)),
        "metrics": {
            "from": "the workers' /metrics through the API server's pod proxy",
            "read": scraped.read,
            "unreadable": scraped.unreadable,
        },
        "calls": calls(spec.get("processor"), scraped),
        "dlq": None,
        "redrive": st.get("redrive"),
        "rewind": st.get("rewind"),
        # The operator's own Kafka clients: why it has no lag, which tenant values it bounded.
        "operatorClients": st.get("operatorClients"),
        "events": cluster.events(name, EVENTS_SHOWN),
    }
    dlq_topic = ((spec.get("errors") or {}).get("dlq") or {}).get("topic")
    if dlq_topic:
        report["dlq"] = {"topic": dlq_topic, "records": None}
    queue_mode = report["groupType"] == "share"
    if queue_mode:
        report["lag"] = queue_mode_lag(scraped)
    try:
        access = kafka_access(cluster, pipeline_spec(manifest), KAFKA_TIMEOUT)
        admin = check_reachable(access, KAFKA_TIMEOUT)
        if not queue_mode:
            report["partitions"] = partition_rows(report, access, admin, scraped)
            rows = report["partitions"]
            report["lag"] = {
                "records": sum(r["lag"] for r in rows),
                "seconds": max((float(r["lagSeconds"] or 0.0) for r in rows), default=0.0),
                "from": "kafka",
            }
        if dlq_topic:
            report["dlq"]["records"] = topic_size(admin, dlq_topic, access, KAFKA_TIMEOUT)
    except PluginError as exc:
        kafka_error: str | None = str(exc)
        if scraped.partitions and not queue_mode:
            report["partitions"] = _rows_from_metrics(scraped)
    else:
        kafka_error = None
    report["slo"] = slo_burn(spec.get("slo"), report["lag"]["seconds"], scraped)
    return report, kafka_error


def partition_rows(
    report: JSON, access: KafkaAccess, admin: AdminClient, scraped: worker_metrics.Scrape
) -> list[JSON]:
    """A consumer group's partitions from Kafka: owner, committed offset, log end, lag."""
    held = owners(admin, access.spec.source.group_id, KAFKA_TIMEOUT)
    # A member is known by its host; the pod with that IP is the one people look for, and
    # the pod whose worker reports the partition's lag holds it for sure (behind a NAT or
    # a proxy, the host the broker sees is no pod's).
    by_ip = {p["ip"]: p["name"] for p in report["pods"] if p["ip"]}
    held = {tp: by_ip.get(who, who) for tp, who in held.items()}
    held.update({tp: row["pod"] for tp, row in scraped.partitions.items()})
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
                "trend": _trend(scraped, p.topic, p.partition),
            }
        )
    return rows


#: Why queue mode shows no lag, in the report and in the operator's status (both leave it out).
QUEUE_MODE_LAG = (
    "a share group commits no offsets to count lag from (and the Python AdminClient cannot "
    "read its start offsets), so status.lag and status.lagSeconds are left out"
)


def queue_mode_lag(scraped: worker_metrics.Scrape) -> JSON:
    """Queue mode: no lag, the reason, and the age of records when the workers acquired them
    (their offtake_consumer_lag_seconds, which autoscaling on targetLagSeconds follows)."""
    ages = [
        float(row[worker_metrics.LAG_SECONDS])
        for row in scraped.partitions.values()
        if row.get(worker_metrics.LAG_SECONDS) is not None
    ]
    return {
        "records": None,
        "seconds": None,
        "from": "n/a in queue mode",
        "why": QUEUE_MODE_LAG,
        "acquiredAgeSeconds": round(max(ages), 1) if ages else None,
        "backlog": queue_backlog(scraped),
    }


#: What the queue-mode backlog leaves out, in the report and in docs/queue-mode.md.
BACKLOG_LEAVES_OUT = (
    "released records (delivered again from behind the frontier) and records acquired but "
    "not yet acknowledged"
)


def queue_backlog(scraped: worker_metrics.Scrape) -> JSON:
    """The share group's backlog, an estimate: per partition the records past the acquisition
    frontier (the least any worker reports), summed; partitions no worker has acquired from
    since it started are not counted."""
    rows = scraped.backlog
    return {
        "records": int(sum(rows.values())) if rows else None,
        "partitions": len(rows),
        "estimate": True,
        "leavesOut": BACKLOG_LEAVES_OUT,
    }


def calls(processor: Mapping[str, Any] | None, scraped: worker_metrics.Scrape) -> JSON | None:
    """With ``processor.concurrency`` above 1: the workers' calls in flight and records waiting
    (summed), the oldest call's age (the worst worker's), and each worker's three; None at
    concurrency 1, where one call at a time says nothing more than the lag."""
    processor = processor or {}
    concurrency = int(processor.get("concurrency") or 1)
    if concurrency <= 1:
        return None
    rows = scraped.calls

    def total(name: str) -> int | None:
        return int(sum(r.get(name, 0.0) for r in rows.values())) if rows else None

    oldest = [
        r[worker_metrics.OLDEST_CALL] for r in rows.values() if worker_metrics.OLDEST_CALL in r
    ]
    return {
        "concurrency": concurrency,
        "order": processor.get("order", "key"),
        "inFlight": total(worker_metrics.CALLS_IN_FLIGHT),
        "waiting": total(worker_metrics.RECORDS_WAITING),
        "oldestSeconds": round(max(oldest), 1) if oldest else None,
        "pods": {
            pod: {
                "inFlight": int(r.get(worker_metrics.CALLS_IN_FLIGHT, 0.0)),
                "waiting": int(r.get(worker_metrics.RECORDS_WAITING, 0.0)),
                "oldestSeconds": round(r.get(worker_metrics.OLDEST_CALL, 0.0), 1),
            }
            for pod, r in sorted(rows.items())
        },
    }


def _render_calls(c: Mapping[str, Any] | None) -> list[str]:
    if c is None:
        return []
    lines = [
        f"calls (processor.concurrency {c['concurrency']}, order {one_line(c['order'])}): "
        f"{_cell(c['inFlight'])} in flight, {_cell(c['waiting'])} records waiting behind a "
        f"busy {'partition' if c['order'] == 'partition' else 'key'}, oldest call "
        f"{_cell(c['oldestSeconds'])} s (from the workers' /metrics)"
    ]
    for pod, r in c["pods"].items():
        lines.append(
            f"  {one_line(pod):<40} {r['inFlight']:>6} in flight {r['waiting']:>7} waiting "
            f"oldest {r['oldestSeconds']} s"
        )
    return lines


def _trend(scraped: worker_metrics.Scrape, topic: str, partition: int) -> float | None:
    value = scraped.partitions.get((topic, partition), {}).get(worker_metrics.TREND)
    return None if value is None else round(float(value), 2) or 0.0  # never "-0.0"


def _rows_from_metrics(scraped: worker_metrics.Scrape) -> list[JSON]:
    """Kafka out of reach: each partition as the worker that holds it reports it."""
    rows: list[JSON] = []
    for (topic, partition), row in sorted(scraped.partitions.items()):
        seconds = row.get(worker_metrics.LAG_SECONDS)
        lag = row.get(worker_metrics.LAG)
        rows.append(
            {
                "topic": topic,
                "partition": partition,
                "owner": row["pod"],
                "committed": None,
                "logEnd": None,
                "lag": None if lag is None else int(lag),
                "lagSeconds": None if seconds is None else round(float(seconds), 1),
                "trend": _trend(scraped, topic, partition),
            }
        )
    return rows


def slo_burn(
    slo: Mapping[str, Any] | None, lag_seconds: float | None, scraped: worker_metrics.Scrape
) -> JSON | None:
    """Each objective of ``spec.slo`` against what was observed here, as a burn: the budget's
    consumption over its allowance (1.0 uses it exactly; above 1 breaches it). The PrometheusRule's
    alerts judge over their windows; this is a reading now, labelled with what it is."""
    if not slo:
        return None
    out: JSON = {}
    max_lag = slo.get("maxLagSeconds")
    if max_lag:
        out["lag"] = {
            "objectiveSeconds": max_lag,
            "observedSeconds": lag_seconds,
            "burn": None if lag_seconds is None else round(float(lag_seconds) / max_lag, 2),
            "basis": "the worst partition's lag in seconds now, over spec.slo.maxLagSeconds",
        }
    budget = slo.get("maxErrorRatio")
    if budget:
        outcomes = scraped.outcomes
        errors = sum(v for o, v in outcomes.items() if o in worker_metrics.ERROR_OUTCOMES)
        done = sum(v for o, v in outcomes.items() if o != "retried")
        ratio = errors / done if done else None
        out["errors"] = {
            "budget": budget,
            "errors": int(errors),
            "done": int(done),
            "ratio": None if ratio is None else round(ratio, 6),
            "burn": None if ratio is None else round(ratio / budget, 2),
            "basis": "records ended in dlq, skipped or failed over records done, from the "
            "workers' counters since they started, over spec.slo.maxErrorRatio"
            if scraped.read
            else "not read: the workers' metrics could not be read",
        }
    if slo.get("maxTimeSinceLastCommitSeconds"):
        out["commits"] = {
            "objectiveSeconds": slo["maxTimeSinceLastCommitSeconds"],
            "burn": None,
            "basis": "judged by the alert OfftakeSLONoCommit (needs Prometheus), not here",
        }
    return out


def _cell(value: Any) -> str:
    return "-" if value is None else one_line(value)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}/s"


def _mode(group_type: str) -> str:
    if group_type == "share":
        return "; queue mode (share group: every worker takes records of every partition)"
    return ""


def _render_lag(lag: Mapping[str, Any]) -> list[str]:
    """The lag line: records and seconds, or (queue mode) why not and the backlog's estimate."""
    lines: list[str] = []
    if "why" in lag:
        lines.append(f"lag: {lag['from']}: {lag['why']}")
        lines.append(
            f"  records were {_cell(lag['acquiredAgeSeconds'])} s old when the workers acquired "
            "them (their offtake_consumer_lag_seconds, which autoscaling follows)"
        )
        backlog = lag.get("backlog")
        if backlog is not None:
            lines.append(
                f"  backlog (an estimate): {_cell(backlog['records'])} records past the "
                f"acquisition frontier in {backlog['partitions']} partition(s), from the "
                f"workers' offtake_share_backlog_messages; leaves out {backlog['leavesOut']}"
            )
    else:
        lines.append(
            f"lag: {_cell(lag['records'])} records, {_cell(lag['seconds'])} s (from {lag['from']})"
        )
    return lines


def _render_operator_clients(clients: Mapping[str, Any] | None) -> list[str]:
    """status.operatorClients: why the operator's lag is missing, which tenant values its own
    clients replaced (the tenant's config says otherwise, so say why)."""
    if not clients:
        return []
    lines: list[str] = []
    if clients.get("lagError"):
        lines.append(f"operator lag: not measured: {one_line(clients['lagError'])}")
    for value in clients.get("overridden") or []:
        lines.append(f"operator clients overrode {one_line(value)} (the workers keep the tenant's)")
    return lines


def _render_partitions(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The per-partition table (topics from the cluster escaped, one line each)."""
    lines: list[str] = []
    tw = max([5, *(len(one_line(p["topic"])) for p in rows)])
    ow = max([5, *(len(_cell(p["owner"])) for p in rows)])
    lines.append(
        f"{'TOPIC':<{tw}} {'PART':>4} {'OWNER':<{ow}} {'COMMITTED':>10} {'LOG END':>10} "
        f"{'LAG':>8} {'LAG(S)':>7} {'TREND(1m)':>9}"
    )
    for p in rows:
        lines.append(
            f"{one_line(p['topic']):<{tw}} {p['partition']:>4} {_cell(p['owner']):<{ow}} "
            f"{_cell(p['committed']):>10} {_cell(p['logEnd']):>10} {_cell(p['lag']):>8} "
            f"{_cell(p['lagSeconds']):>7} {_rate(p['trend']):>9}"
        )
    return lines


def render(report: Mapping[str, Any], kafka_error: str | None) -> str:
    """The text a terminal shows; every string from the cluster (a message, a reason, an
    Event) on one line with its control characters escaped (terminal.one_line)."""
    r = report["replicas"]
    lines = [
        f"ConsumerPipeline {report['namespace']}/{report['name']}: {one_line(report['phase'])}"
        f" ({one_line(report['reason'])}) {one_line(report['message'])}",
        f"workers: {r['ready']}/{_cell(r['desired'])} ready, {r['running']} running"
        + _mode(report.get("groupType", "consumer")),
    ]
    lines.extend(_render_lag(report["lag"]))
    lines.extend(_render_operator_clients(report.get("operatorClients")))
    lines.extend(_render_calls(report.get("calls")))
    lines.append("conditions:")
    for c in report["conditions"]:
        lines.append(
            f"  {one_line(c['type']):<12} {one_line(c['status']):<6} {one_line(c['reason'])}: "
            f"{one_line(c['message'])}"
        )
    if kafka_error is not None:
        shown = "the workers' own lag is shown" if report["partitions"] else "not shown"
        lines.append(
            f"kafka: {one_line(kafka_error)}; committed offsets, log ends and the DLQ size need "
            f"Kafka, per-partition lag: {shown} (everything else comes from the API server)"
        )
    metrics = report["metrics"]
    if metrics["unreadable"]:
        lines.append(
            "metrics: not read from "
            + "; ".join(f"{pod}: {one_line(why)}" for pod, why in metrics["unreadable"].items())
            + " (their partitions' TREND and the error burn are not shown)"
        )
    if report["partitions"] is not None:
        lines.extend(_render_partitions(report["partitions"]))
    lines.append("pods:" if report["pods"] else "pods: none")
    for pod in report["pods"]:
        current = {None: "?", True: "current", False: "OLD CONFIG"}[pod["currentConfig"]]
        state = "ready" if pod["ready"] else "not ready"
        gone = " terminating" if pod["terminating"] else ""
        lines.append(f"  {pod['name']:<40} {state:<9} restarts {pod['restarts']}  {current}{gone}")
    lines.extend(_render_slo(report["slo"]))
    dlq = report["dlq"]
    if dlq is not None:
        lines.append(f"dead letters: {_cell(dlq['records'])} in {one_line(dlq['topic'])}")
    redrive = report["redrive"]
    if redrive:
        lines.append(
            "last redrive: "
            + ", ".join(
                f"{k} {one_line(redrive[k])}"
                for k in ("lastId", "activeId", "replayed", "left", "skipped", "message")
                if k in redrive
            )
        )
    lines.append("events:" if report["events"] else "events: none")
    for e in report["events"]:
        lines.append(
            f"  {one_line(e['time'])} {one_line(e['type']):<7} {one_line(e['reason'])}: "
            f"{one_line(e['message'])}"
        )
    return "\n".join(lines)


def _render_slo(slo: Mapping[str, Any] | None) -> list[str]:
    if not slo:
        return []
    lines = ["slo burn (1.0 = the whole allowance; above it, breached):"]
    lag = slo.get("lag")
    if lag:
        burn = "-" if lag["burn"] is None else f"{lag['burn']:.2f}x"
        lines.append(
            f"  lag      {burn:>8}  worst {_cell(lag['observedSeconds'])} s now, "
            f"objective {lag['objectiveSeconds']} s"
        )
    errors = slo.get("errors")
    if errors:
        burn = "-" if errors["burn"] is None else f"{errors['burn']:.2f}x"
        if errors["ratio"] is None:
            seen = "no records done" if errors["basis"].startswith("records") else "no metrics"
        else:
            seen = (
                f"{errors['errors']} of {errors['done']} records in dlq/skipped/failed "
                "since the workers started"
            )
        lines.append(f"  errors   {burn:>8}  {seen}, budget {errors['budget']}")
    commits = slo.get("commits")
    if commits:
        lines.append(
            f"  commits         -  objective {commits['objectiveSeconds']} s: judged by the "
            "alert OfftakeSLONoCommit (Prometheus)"
        )
    return lines


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
            f"{r['name']:<28} {one_line(r['phase']):<9} {r['ready']:<6} {_cell(r['lag']):>8} "
            f"{_cell(r['lagSeconds']):>7}  {one_line(r['reason'])}  {one_line(r['message'])}"
        )
    return "\n".join(lines)
