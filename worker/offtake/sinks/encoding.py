"""How processed values become bytes on the wire (Kafka sink, DLQ, sidecar)."""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from typing import Any

# Values JSON has no type for but whose text form is unambiguous: written as that text.
_AS_TEXT = (datetime.date, datetime.time, datetime.timedelta, decimal.Decimal, uuid.UUID)


class UnsendableValueError(TypeError):
    """A processor returned a value that has no faithful wire form (the error names its type)."""


def _as_text(value: Any) -> str:
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, _AS_TEXT):
        return str(value)
    # Not str(value): "<Foo object at 0x7f...>" would be sent as if it were the record's data
    # (found by the chaos suite); the error goes to the pipeline's error policy instead.
    raise UnsendableValueError(
        f"cannot send a value of type {type(value).__module__}.{type(value).__qualname__}: "
        "return bytes, str, None, or JSON-serialisable data (dict, list, number, bool)"
    )


def encode_value(value: Any) -> bytes | None:
    """bytes as they are, str as UTF-8, None as a tombstone, anything else as compact JSON
    (dates, times, decimals and UUIDs as their text); raises UnsendableValueError for a value
    with no such form."""
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_as_text)
    except ValueError as exc:  # a circular structure, or NaN-free JSON refused
        raise UnsendableValueError(f"cannot send the value as JSON: {exc}") from exc
    return text.encode("utf-8")
