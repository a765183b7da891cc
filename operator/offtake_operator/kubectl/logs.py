"""``kubectl offtake logs``: every worker's JSON log, merged by time and readable.

The workers log one JSON object per line (offtake.logs: timestamp, level, logger, message,
pipeline, and any extra fields). Lines of all pods are merged by timestamp; a line that is not
JSON (a crash's traceback) keeps its place after the last stamped line of its pod.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .. import names
from .terminal import one_line

JSON = dict[str, Any]
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: Fields every line has, shown in the line's head rather than as key=value.
_HEAD = ("timestamp", "level", "logger", "message", "pipeline", "pod")


def worker_container(pod: Mapping[str, Any]) -> str:
    """The container that runs the worker: ``worker``, or the injected ``offtake-worker``."""
    spec = pod.get("spec") or {}
    listed = [
        c["name"] for c in (spec.get("containers") or []) + (spec.get("initContainers") or [])
    ]
    for name in (names.WORKER_CONTAINER, names.INJECTED_CONTAINER):
        if name in listed:
            return name
    return names.WORKER_CONTAINER


def parse(pod: str, lines: Iterable[str]) -> list[JSON]:
    out: list[JSON] = []
    last = ""
    for line in lines:
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if not isinstance(entry, dict) or "timestamp" not in entry:
            entry = {"timestamp": last, "level": "-", "logger": "", "message": line.rstrip()}
        last = str(entry["timestamp"])
        out.append({**entry, "pod": pod})
    return out


def merge(logs: Mapping[str, Iterable[str]], level: str = "DEBUG") -> list[JSON]:
    """Every pod's lines, oldest first, at ``level`` or above (unstamped lines always kept)."""
    floor = LEVELS.index(level)
    entries: list[JSON] = []
    for pod, lines in logs.items():
        for entry in parse(pod, lines):
            lvl = str(entry.get("level", "-"))
            if lvl in LEVELS and LEVELS.index(lvl) < floor:
                continue
            entries.append(entry)
    # Stable: lines of one pod with the same timestamp keep their order.
    return sorted(entries, key=lambda e: str(e["timestamp"]))


def render(entries: Sequence[Mapping[str, Any]]) -> str:
    """The text a terminal shows: each field of a log line on one line, its control
    characters escaped (terminal.one_line); a traceback's own lines stay lines."""
    lines = []
    for e in entries:
        extra = " ".join(
            f"{one_line(k)}={one_line(json.dumps(v) if not isinstance(v, str) else v)}"
            for k, v in e.items()
            if k not in _HEAD and k not in ("exception", "stack")
        )
        head = (
            f"{one_line(e['timestamp'])} {one_line(e['pod'])} "
            f"{one_line(e.get('level', '-')):<7} {one_line(e.get('logger', ''))}"
        )
        lines.append(f"{head}: {one_line(e.get('message', ''))}" + (f"  {extra}" if extra else ""))
        for key in ("exception", "stack"):
            if key in e:
                lines.extend(f"    {one_line(t)}" for t in str(e[key]).splitlines())
    return "\n".join(lines)
