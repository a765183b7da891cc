"""The formats without a schema: json, string, bytes.

JSON is read and written by orjson (the fast JSON library Quix Streams also uses: on this
engine's JSON workload the standard library was a fifth of the time per record). What orjson
refuses but the standard library reads or writes (an int beyond 64 bits, NaN, non-string dict
keys) goes through the standard library, so what can be read and sent is unchanged; the one
difference is that orjson writes NaN and infinities as ``null`` (JSON has no NaN;
``json.dumps`` wrote ``NaN``, which strict JSON readers refuse).
"""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from offtake.formats.base import Decoder, Encoder
from offtake.formats.errors import DecodeError, UnsendableValueError


class JsonDecoder(Decoder):
    format = "json"

    def value(self, raw: bytes, topic: str) -> Any:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # an int beyond 64 bits, NaN: the standard library reads them, or says why not
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DecodeError(f"value is not valid json: {exc}") from None

    def fast(self, topic: str) -> tuple[Callable[[bytes], Any], tuple[type[Exception], ...]]:
        return orjson.loads, (orjson.JSONDecodeError,)


class StringDecoder(Decoder):
    format = "string"

    def value(self, raw: bytes, topic: str) -> Any:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"value is not valid string: {exc}") from None

    def fast(self, topic: str) -> tuple[Callable[[bytes], Any], tuple[type[Exception], ...]]:
        return _utf8, (UnicodeDecodeError,)


class BytesDecoder(Decoder):
    format = "bytes"

    def value(self, raw: bytes, topic: str) -> Any:
        return raw

    def fast(self, topic: str) -> tuple[Callable[[bytes], Any], tuple[type[Exception], ...]]:
        return _same, ()


def _utf8(raw: bytes) -> str:
    return raw.decode("utf-8")


def _same(raw: bytes) -> bytes:
    return raw


# Values JSON has no type for but whose text form is unambiguous: written as that text.
_AS_TEXT = (datetime.date, datetime.time, datetime.timedelta, decimal.Decimal, uuid.UUID)


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
_dumps = orjson.dumps


def encode_value(value: Any) -> bytes | None:
    """bytes as they are, str as UTF-8, None as a tombstone, anything else as compact JSON
    (dates, times, decimals and UUIDs as their text); raises UnsendableValueError for a value
    with no such form."""
    if type(value) is not dict:  # a dict (what JSON functions return) goes straight to orjson
        if value is None:
            return None
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        if isinstance(value, str):
            return value.encode("utf-8")
    try:
        # Positional: orjson parses them in about half the time of keywords.
        return _dumps(value, _as_text, _ORJSON_OPTIONS)
    except orjson.JSONEncodeError:
        pass  # the standard library writes it, or says why not (below)
    return _encode_json_stdlib(value)


def _encode_json_stdlib(value: Any) -> bytes:
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_as_text)
    except ValueError as exc:  # a circular structure, or NaN-free JSON refused
        raise UnsendableValueError(f"cannot send the value as JSON: {exc}") from exc
    return text.encode("utf-8")


class JsonEncoder(Encoder):
    """The sink's ``format: json``: :func:`encode_value` (bytes and str as they are)."""

    format = "json"
    # A plain function, so that the Kafka sink can tell this encoder's bytes-as-they-are
    # (it may forward consumed bytes unchanged) from a schema'd one by identity.
    encode = staticmethod(encode_value)

    def encode_many(self, values: Any) -> tuple[list[bytes | None], dict[int, Exception]]:
        # The common case (every value JSON-serialisable) in one comprehension, no try per value.
        try:
            return [encode_value(v) for v in values], {}
        except Exception:
            return super().encode_many(values)
