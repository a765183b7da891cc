"""``spec.redrive``: a request to replay a pipeline's dead letters once, through the pipeline.

Parsed here, below both the worker's ``offtake redrive`` and the operator, so that the CLI,
``offtake validate``, the worker's loader and the operator read the same fields the same way
and name the same field in their errors.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from offtake.config._fields import ConfigError, field_name


@dataclass(frozen=True)
class RedriveRequest:
    #: A new id requests a new redrive; it marks the records it replays (header
    #: ``offtake.redrive.id``) and its counts in the redrive group's commits.
    id: str
    #: The dead-letter topic to read (``spec.redrive.from``, default ``errors.dlq.topic``).
    source: str
    #: Dead letters stamped after this are left where they are.
    until: datetime.datetime

    @property
    def until_ms(self) -> int:
        return int(self.until.timestamp() * 1000)

    @property
    def until_text(self) -> str:
        return self.until.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_until(text: Any, field: str = "spec.redrive.until") -> datetime.datetime:
    """An RFC 3339 timestamp with a time zone, e.g. ``2026-05-01T12:00:00Z``."""
    if not isinstance(text, str) or not text:
        raise ConfigError(field, "is required: an RFC 3339 timestamp such as 2026-05-01T12:00:00Z")
    try:
        stamp = datetime.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ConfigError(
            field, f"expected an RFC 3339 timestamp such as 2026-05-01T12:00:00Z, got {text!r}"
        ) from None
    if stamp.tzinfo is None:
        raise ConfigError(field, f"needs a time zone (e.g. Z), got {text!r}")
    return stamp


def dlq_topic_of(spec: Mapping[str, Any]) -> str | None:
    """``spec.errors.dlq.topic`` as written, if any (the default of ``spec.redrive.from``)."""
    errors = spec.get("errors")
    dlq = errors.get("dlq") if isinstance(errors, Mapping) else None
    topic = dlq.get("topic") if isinstance(dlq, Mapping) else None
    return topic if isinstance(topic, str) and topic else None


def parse_redrive(raw: Any, dlq_topic: str | None) -> RedriveRequest | None:
    """Read ``spec.redrive`` (None when absent); raise ConfigError naming the field."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError("spec.redrive", "expected a mapping with id, from and until")
    unknown = sorted((k for k in raw if k not in ("id", "from", "until")), key=str)
    if unknown:
        raise ConfigError(
            f"spec.redrive.{field_name(unknown[0])}", "unknown field (expected id, from, until)"
        )
    rid = raw.get("id")
    if not isinstance(rid, str) or not rid:
        raise ConfigError("spec.redrive.id", "is required: a new id requests a new redrive")
    if len(rid) > 63 or not re.fullmatch(r"[A-Za-z0-9._-]+", rid):
        raise ConfigError(
            "spec.redrive.id", f"expected at most 63 letters, digits, '.', '_' or '-', got {rid!r}"
        )
    source = raw.get("from", dlq_topic)
    if source is None:
        raise ConfigError(
            "spec.redrive.from",
            "is required: the dead-letter topic to replay (the pipeline has no errors.dlq.topic)",
        )
    if not isinstance(source, str) or not source:
        raise ConfigError("spec.redrive.from", f"expected a topic name, got {source!r}")
    return RedriveRequest(id=rid, source=source, until=parse_until(raw.get("until")))


def redrive_group(group_id: str) -> str:
    """The consumer group that records a pipeline's redrives: one group, so that each redrive
    starts where the previous one stopped and no dead letter is replayed by two of them."""
    return f"{group_id}.redrive"
