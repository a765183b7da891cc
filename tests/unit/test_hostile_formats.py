"""Hostile schemas and values cost time in proportion to their bytes (issue 38, item 2):
JSON Schema patterns match in RE2, a pattern RE2 cannot run is refused naming it, and a
Protobuf message index that claims more than it carries is that record's OutOfBounds."""

from __future__ import annotations

import json
import time

import pytest

from offtake.formats.errors import OutOfBounds
from offtake.formats.jsonschema import SchemaMismatch, _check, compiled
from offtake.formats.patterns import UnsafePattern
from offtake.formats.protobuf import payload_start
from offtake.formats.wire import HEADER_SIZE

CATASTROPHIC = "^(a+)+$"  # Python's re: seconds at 24 characters, doubling with each


def test_a_catastrophic_pattern_matches_in_linear_time_with_the_same_answers() -> None:
    validator = compiled(json.dumps({"type": "string", "pattern": CATASTROPHIC}))
    _check(validator, "a" * 5000)  # matches
    began = time.perf_counter()
    with pytest.raises(SchemaMismatch):
        _check(validator, "a" * 5000 + "!")  # the backtracking case: does not match
    assert time.perf_counter() - began < 1.0


def test_pattern_properties_match_in_re2_too() -> None:
    schema = {
        "type": "object",
        "patternProperties": {CATASTROPHIC: {"type": "integer"}},
        "additionalProperties": False,
    }
    validator = compiled(json.dumps(schema))
    _check(validator, {"aaaa": 1})
    with pytest.raises(SchemaMismatch):
        _check(validator, {"a" * 3000 + "!": 1})  # no pattern takes it: additional


@pytest.mark.parametrize("pattern", [r"(a)\1", r"a(?=b)", r"(?<!x)y"])
def test_a_pattern_re2_cannot_run_is_refused_at_schema_load_naming_it(pattern: str) -> None:
    with pytest.raises(UnsafePattern) as refused:
        compiled(json.dumps({"type": "string", "pattern": pattern}))
    assert repr(pattern) in str(refused.value)  # named as written


def _value(index: bytes) -> bytes:
    return b"\x00" + b"\x00\x00\x00\x01" + index + b"\x08\x01"


def test_a_varint_past_ten_bytes_is_out_of_bounds_at_once() -> None:
    raw = _value(b"\xff" * 400_000 + b"\x01")
    began = time.perf_counter()
    with pytest.raises(OutOfBounds):
        payload_start(raw)
    assert time.perf_counter() - began < 0.05


def test_an_index_count_past_the_bytes_left_or_the_schema_is_out_of_bounds() -> None:
    with pytest.raises(OutOfBounds):
        payload_start(_value(b"\xfe\x01"))  # zigzag 127 indexes, 2 bytes left
    with pytest.raises(OutOfBounds):
        payload_start(_value(b"\x06\x00\x00\x00"), max_depth=2)  # 3 indexes, depth 2


def test_an_ordinary_index_is_read_as_before() -> None:
    assert payload_start(_value(b"\x00")) == HEADER_SIZE + 1  # the first message
    assert payload_start(_value(b"\x04\x02\x00"), max_depth=2) == HEADER_SIZE + 3
    with pytest.raises(ValueError):
        payload_start(_value(b"")[:HEADER_SIZE] + b"\x80")  # ends early
