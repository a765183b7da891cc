"""How processed values become bytes on the wire (Kafka sink, DLQ, sidecar)."""

from __future__ import annotations

import json
from typing import Any


def encode_value(value: Any) -> bytes | None:
    """bytes as they are, str as UTF-8, None as a tombstone, anything else as compact JSON."""
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode("utf-8")
