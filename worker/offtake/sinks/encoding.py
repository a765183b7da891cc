"""How processed values become bytes on the wire (Kafka sink, DLQ, sidecar).

JSON is written by orjson (the fast JSON library Quix Streams also uses: on this engine's JSON
workload the standard library's encoder was a fifth of the time per record). A value orjson
refuses but the standard library writes (an int beyond 64 bits, non-string dict keys) falls
back to the standard library, so what can be sent is unchanged; the one difference is that
orjson writes NaN and infinities as ``null`` (JSON has no NaN; ``json.dumps`` wrote ``NaN``,
which strict JSON readers refuse).
"""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from typing import Any

import orjson

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


# Dates and times go through _as_text (isoformat) as before, not orjson's own RFC 3339 form;
# a dataclass is refused as before rather than sent as an object.
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


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
        return orjson.dumps(value, default=_as_text, option=_ORJSON_OPTIONS)
    except orjson.JSONEncodeError:
        pass  # the standard library writes it, or says why not (below)
    return _encode_json_stdlib(value)


def _encode_json_stdlib(value: Any) -> bytes:
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_as_text)
    except ValueError as exc:  # a circular structure, or NaN-free JSON refused
        raise UnsendableValueError(f"cannot send the value as JSON: {exc}") from exc
    return text.encode("utf-8")
