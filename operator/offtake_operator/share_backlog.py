"""Queue mode: the share group's backlog for ``status.backlog``, from the workers' own metrics.

A share group has no committed offsets and no released confluent-kafka can read its start
offsets (DescribeShareGroupOffsets), so the broker alone cannot say how far behind it is. The
workers can: each exports ``offtake_share_backlog_messages{topic,partition}``, the records past
the acquisition frontier as it knows it (docs/queue-mode.md). The worker furthest ahead knows
the frontier best, so the group's backlog is the least any worker reports per partition,
summed: an estimate, which leaves out released records and records acquired but not yet
acknowledged.

The operator reads each running worker's /metrics by pod IP on the pipeline's metrics port.
A worker runs the tenant's code, so what it answers is read as data, bounded: a short timeout,
at most MAX_BYTES, and only the backlog's lines, parsed by one regular expression (linear in
the text). A worker that does not answer is left out; none answering leaves no backlog.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp

from offtake.contract import SHARE_BACKLOG_METRIC

TP = tuple[str, int]

#: Per worker: what one scrape may take and read.
TIMEOUT_SECONDS = 2.0
MAX_BYTES = 1 << 20
#: One sample of the backlog: its labels (any order) and value.
_SAMPLE = re.compile(
    rf"^{SHARE_BACKLOG_METRIC}\{{([^}}\n]{{1,600}})\}} ([0-9.e+]{{1,32}})$", re.MULTILINE
)
_LABEL = re.compile(r'(\w{1,32})="([^"\\]{0,249})"')


def parse_backlog(text: str) -> dict[TP, float]:
    """One worker's backlog per partition from its /metrics text."""
    out: dict[TP, float] = {}
    for labels, value in _SAMPLE.findall(text):
        named = dict(_LABEL.findall(labels))
        topic, partition = named.get("topic"), named.get("partition", "")
        if not topic or not partition.isdigit() or len(partition) > 9:
            continue
        try:
            out[topic, int(partition)] = float(value)
        except ValueError:
            continue
    return out


def group_backlog(per_worker: Iterable[Mapping[TP, float]]) -> dict[TP, int]:
    """Per partition, the least backlog any worker reports."""
    out: dict[TP, int] = {}
    for backlog in per_worker:
        for tp, value in backlog.items():
            out[tp] = min(int(value), out.get(tp, int(value)))
    return out


def worker_addresses(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """The IPs of the pipeline's running workers (not leaving)."""
    out = []
    for pod in pods:
        meta, st = pod.get("metadata") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp") or st.get("phase") != "Running" or not st.get("podIP"):
            continue
        out.append(str(st["podIP"]))
    return out


async def _scrape(session: aiohttp.ClientSession, ip: str, port: int) -> dict[TP, float]:
    host = f"[{ip}]" if ":" in ip else ip
    try:
        async with session.get(f"http://{host}:{port}/metrics", allow_redirects=False) as resp:
            if resp.status != 200:
                return {}
            body = await resp.content.read(MAX_BYTES)
    except (aiohttp.ClientError, TimeoutError, OSError):
        return {}
    return parse_backlog(body.decode("utf-8", errors="replace"))


async def read_backlog(pods: Iterable[Mapping[str, Any]], port: int) -> dict[TP, int] | None:
    """The group's backlog per partition from its workers; None when no worker reported one."""
    addresses = worker_addresses(pods)
    if not addresses:
        return None
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        scraped = await asyncio.gather(*(_scrape(session, ip, port) for ip in addresses))
    backlog = group_backlog(scraped)
    return backlog or None
