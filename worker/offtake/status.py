"""``offtake status``: where a pipeline's consumer group stands, for people not on Kubernetes.

Per partition: the committed offset, the log end, lag in records and in seconds; with
``--metrics`` also a running worker's in-flight records and paused partitions. Refreshes like
``top`` until Ctrl-C, or prints once with ``--once``.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from offtake.config.spec import PipelineSpec
from offtake.kafka.config import consumer_config
from offtake.kafka.group_view import PartitionPosition, group_positions

WORKER_GAUGES = {
    "offtake_inflight_messages": "in-flight records",
    "offtake_paused_partitions": "paused partitions",
    "offtake_assigned_partitions": "assigned partitions",
}
#: Queue mode: what a worker reports of its share group (counters, summed over labels).
SHARE_SERIES = {
    "offtake_share_acquired_total": "records acquired",
    "offtake_share_redelivered_total": "records redelivered",
    "offtake_consumer_lag_seconds": "lag seconds (max)",
}


def render(spec: PipelineSpec, positions: list[PartitionPosition], worker: dict[str, float]) -> str:
    now_ms = time.time() * 1000
    lines = [
        f"pipeline {spec.namespace}/{spec.name}  {spec.source.group_type} group "
        f"{spec.source.group_id}  at {time.strftime('%H:%M:%S')}",
    ]
    if spec.source.is_share_group:
        return "\n".join([*lines, *_share_rows(positions, worker)])
    lines.append(
        f"{'topic':<30} {'part':>4} {'committed':>10} {'log end':>10} {'lag':>8} {'lag s':>8}"
    )
    total = 0
    for p in positions:
        seconds = p.lag_seconds(now_ms)
        committed = "-" if p.committed is None else str(p.committed)
        lag_s = "?" if seconds is None else f"{seconds:.1f}"
        lines.append(
            f"{p.topic:<30} {p.partition:>4} {committed:>10} {p.log_end:>10} {p.lag:>8} {lag_s:>8}"
        )
        total += p.lag
    lines.append(f"{'total':<30} {'':>4} {'':>10} {'':>10} {total:>8}")
    for name, label in WORKER_GAUGES.items():
        if name in worker:
            lines.append(f"worker: {label} {worker[name]:.0f}")
    return "\n".join(lines)


def _share_rows(positions: list[PartitionPosition], worker: dict[str, float]) -> list[str]:
    """Queue mode: a share group commits no offsets (and the Python AdminClient cannot read
    its start offsets), so per partition only the log; progress is in the workers' metrics."""
    lines = [
        "queue mode (share group): no committed offsets; with --metrics, a worker's records "
        "acquired and lag in seconds (age when acquired)",
        f"{'topic':<30} {'part':>4} {'log start':>10} {'log end':>10}",
    ]
    for p in positions:
        lines.append(f"{p.topic:<30} {p.partition:>4} {p.log_start:>10} {p.log_end:>10}")
    for name, label in SHARE_SERIES.items():
        if name in worker:
            lines.append(f"worker: {label} {worker[name]:.0f}")
    return lines


def worker_gauges(url: str) -> dict[str, float]:
    """The worker-wide gauges of a running worker's /metrics (``host:port`` or a URL)."""
    if not url.startswith("http"):
        url = f"http://{url}"
    if not url.rstrip("/").endswith("/metrics"):
        url = url.rstrip("/") + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode("utf-8")
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "offtake_consumer_lag_seconds":
                out[sample.name] = max(out.get(sample.name, 0.0), sample.value)
            elif sample.name in WORKER_GAUGES or sample.name in SHARE_SERIES:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def run(
    spec: PipelineSpec,
    metrics_url: str | None,
    once: bool,
    interval: float,
    write: Callable[[str], None],
) -> int:
    config = consumer_config(spec)
    while True:
        positions = group_positions(config, spec.source.group_id, list(spec.source.topics))
        worker = worker_gauges(metrics_url) if metrics_url else {}
        text = render(spec, positions, worker)
        if once:
            write(text + "\n")
            return 0
        write("\x1b[H\x1b[2J" + text + "\n")  # clear the screen, like top
        time.sleep(interval)
