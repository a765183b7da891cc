"""The sidecar protocol's JSON, both ways (docs/sidecar-protocol.md, version 1): a record as
the worker sends it (section 2), and one record's result as the worker reads it back.

Plain functions, no I/O: :mod:`offtake.processing.sidecar` sends the requests and reads the
HTTP answers. A result that is wrong about its record (none for it, two, values of the wrong
shape, bad base64) becomes a :class:`SidecarRecordError` of that record, naming its id, so the
engine's bounded retries and error policy apply to it alone.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from offtake.errors import OfftakeError
from offtake.processing.base import Outcome
from offtake.records import Record

# The source formats whose values the protocol carries (others are sent as json).
FORMATS = ("json", "string", "bytes")


class SidecarRecordError(OfftakeError):
    """The sidecar failed one record; ``error_type`` and ``message`` are what it said.

    Also for an answer wrong about one record (none for it, bad values): errors name the id.
    """

    def __init__(self, record_id: str, error_type: str, message: str) -> None:
        super().__init__(f"{error_type}: {message} (record {record_id})")
        self.record_id = record_id
        self.error_type = error_type
        self.message = message


def record_id(record: Record) -> str:
    """``<topic>/<partition>/<offset>``: unambiguous, since Kafka topic names cannot hold '/'."""
    return f"{record.topic}/{record.partition}/{record.offset}"


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _text(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def record_to_wire(record: Record, fmt: str) -> dict[str, Any]:
    """The JSON object the protocol sends for one record (docs/sidecar-protocol.md, section 2)."""
    wire: dict[str, Any] = {
        "id": record_id(record),
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": _text(record.key),
        "keyBase64": _b64(record.key),
    }
    value = record.value
    if fmt == "bytes":
        if value is not None and not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"format bytes expects a bytes value, got {type(value).__name__}")
        wire["valueBase64"] = None if value is None else _b64(bytes(value))
    elif fmt == "string":
        if value is not None and not isinstance(value, str):
            raise TypeError(f"format string expects a str value, got {type(value).__name__}")
        wire["value"] = value
    else:
        wire["value"] = value
    headers = []
    for name, raw in record.headers:
        header_value = bytes(raw) if raw is not None else None
        headers.append(
            {
                "key": name if isinstance(name, str) else bytes(name).decode("utf-8", "replace"),
                "value": _text(header_value),
                "valueBase64": _b64(header_value),
            }
        )
    wire["headers"] = headers
    return wire


def outcome_of(rid: str, items: list[Any], address: str) -> Outcome:
    """One record's outcome from the results the answer has for its id (``rid``), or a
    :class:`SidecarRecordError` naming the id when they are wrong (``address``: the sidecar's,
    for the message)."""

    def bad(message: str) -> Outcome:
        return Outcome(
            [],
            SidecarRecordError(rid, "MalformedResponse", f"sidecar at {address}: {message}"),
        )

    if not items:
        return bad("the response has no result for this record")
    if len(items) > 1:
        return bad(f"the response has {len(items)} results for this record")
    item = items[0]
    error = item.get("error")
    if error is not None:
        retriable = item.get("retriable", True)
        if not isinstance(retriable, bool):
            return bad(f'"retriable" must be true or false, got {retriable!r}')
        if isinstance(error, str):
            return Outcome([], SidecarRecordError(rid, "Error", error), retriable=retriable)
        if not isinstance(error, dict):
            return bad(f'"error" must be an object with type and message, got {error!r}')
        etype, message = error.get("type"), error.get("message")
        return Outcome(
            [],
            SidecarRecordError(
                rid,
                etype if isinstance(etype, str) and etype else "Error",
                message if isinstance(message, str) else json.dumps(message),
            ),
            retriable=retriable,
        )
    values, values_b64 = item.get("values"), item.get("valuesBase64")
    if values is not None and values_b64 is not None:
        return bad('a result has either "values" or "valuesBase64", not both')
    if values_b64 is not None:
        if not isinstance(values_b64, list):
            return bad(f'"valuesBase64" must be a list, got {type(values_b64).__name__}')
        decoded: list[Any] = []
        for v in values_b64:
            if v is None:
                decoded.append(None)
                continue
            try:
                decoded.append(base64.b64decode(v, validate=True))
            except (TypeError, ValueError, binascii.Error):
                return bad(f'"valuesBase64" holds something that is not base64: {v!r:.60}')
        return Outcome(decoded)
    if values is None:
        return Outcome([])  # null or absent: the record is dropped
    if not isinstance(values, list):
        return bad(f'"values" must be a list, got {type(values).__name__}')
    return Outcome(values)
