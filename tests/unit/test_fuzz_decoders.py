"""Fuzzing the decoders (issue 38): for any bytes a producer can write, a decoder answers with a
value or that record's DecodeError (never another exception, which would stop the partition),
within a time bound, without memory growing with the inputs seen. Hypothesis generates the
inputs, each property within a bounded number of examples so the whole file stays well under
60 s in the default suite; a failure prints the shrunk input."""

from __future__ import annotations

import contextlib
import json
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from offtake.formats.avro import AvroDecoder
from offtake.formats.base import Decoder
from offtake.formats.errors import DecodeError
from offtake.formats.jsonschema import JsonSchemaDecoder
from offtake.formats.plain import BytesDecoder, JsonDecoder, StringDecoder
from offtake.formats.protobuf import payload_start

#: Per input: generous for a loaded 2-core machine, far below what a hostile claim costs
#: unbounded (seconds to minutes, issue 38 item 2).
PER_INPUT_SECONDS = 0.5
#: Memory still held after all of a property's inputs (tracemalloc, Python allocations).
HELD_BYTES = 8 * 1024 * 1024
FUZZ = settings(
    max_examples=300,
    deadline=None,  # the bound is asserted per input below, not Hypothesis' flaky deadline
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,  # no .hypothesis directory in the worktree
)

AVRO_SCHEMAS: dict[str, Any] = {
    "record": {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "name", "type": "string"},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "attrs", "type": {"type": "map", "values": ["null", "double"]}},
            {"name": "blob", "type": "bytes"},
            {"name": "kind", "type": {"type": "enum", "name": "K", "symbols": ["A", "B"]}},
            {"name": "fx", "type": {"type": "fixed", "name": "F", "size": 4}},
        ],
    },
    "array of nulls": {"type": "array", "items": "null"},
    "decimal": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
}
JSON_SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "name": {"type": "string", "pattern": "^(a+)+$"}},
    "required": ["id"],
}


class _OneSchema:
    """The registry's answer for every id: the decoder under test is what is fuzzed."""

    def __init__(self, schema: Any, kind: str) -> None:
        self._schema = Schema(json.dumps(schema), kind)

    def get_schema(self, schema_id: int, **kwargs: Any) -> Schema:
        return self._schema


def _decoders() -> Iterator[tuple[str, Decoder]]:
    for name, schema in AVRO_SCHEMAS.items():
        yield f"avro {name}", AvroDecoder(_OneSchema(schema, "AVRO"))  # type: ignore[arg-type]
    yield "jsonschema", JsonSchemaDecoder(_OneSchema(JSON_SCHEMA, "JSON"))  # type: ignore[arg-type]
    yield "json", JsonDecoder()
    yield "string", StringDecoder()
    yield "bytes", BytesDecoder()


DECODERS = dict(_decoders())
WIRE = b"\x00\x00\x00\x00\x01"
#: Raw bytes, and bytes behind a valid wire header (so the schema'd readers get to run),
#: with varint-ish runs (0x80-0xff continuation bytes) that make length and count claims.
PAYLOADS = st.one_of(
    st.binary(max_size=256),
    st.binary(max_size=256).map(lambda b: WIRE + b),
    st.lists(
        st.sampled_from([b"\xff", b"\x80", b"\x01", b"\x00", b"\x7f", b"\xfe\xff\xff\x0f"]),
        max_size=64,
    ).map(lambda parts: WIRE + b"".join(parts)),
)


def _zigzag(n: int) -> bytes:
    """Avro's (and Protobuf's sint) varint of ``n``: how a length or item count is written."""
    z, out = (n << 1) ^ (n >> 63), bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


#: A count or length claim (up to 2**62) followed by a few bytes: what a hostile value makes.
CLAIMS = st.tuples(st.integers(-(2**62), 2**62), st.binary(max_size=16)).map(
    lambda claim: WIRE + _zigzag(claim[0]) + claim[1]
)
PAYLOADS = st.one_of(PAYLOADS, CLAIMS)


def _bounded(call: Any) -> None:
    began = time.perf_counter()
    call()
    took = time.perf_counter() - began
    assert took < PER_INPUT_SECONDS, f"{took:.3f} s for one input"


@pytest.fixture
def held() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
        current, _ = tracemalloc.get_traced_memory()
        assert current < HELD_BYTES, f"{current} bytes still held after the inputs"
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_a_decoder_answers_a_value_or_that_records_decode_error(name: str, held: None) -> None:
    decoder = DECODERS[name]

    @FUZZ
    @given(raw=PAYLOADS)
    @example(raw=WIRE + _zigzag(1 << 40) + b"\x00")  # 2**40 zero-width items (issue 38 item 2)
    def decode(raw: bytes) -> None:
        def one() -> None:
            # A DecodeError is that record's error (the error policy's); anything else fails.
            with contextlib.suppress(DecodeError):
                decoder.value(raw, "fuzz")

        _bounded(one)

    decode()


@FUZZ
@given(raw=PAYLOADS)
def test_a_protobuf_message_index_is_read_or_refused(raw: bytes) -> None:
    def one() -> None:
        try:
            start = payload_start(raw)
        except ValueError:  # OutOfBounds, or an index that ends early: SchemaDecoder.value
            return  # makes either that record's SchemaDecodeError
        assert 5 <= start <= len(raw)

    _bounded(one)


def test_an_avro_value_that_ends_before_its_record_is_that_records_error_at_once() -> None:
    """The fuzz found record values cut short on which avro_fast failed (IndexError) and the
    fallback, fastavro, read past the buffer's end as zeros through a count read before the
    end, in C, for minutes (a whole-suite run's test process grew to 18 GB and was OOM-killed
    while this file ran). A value that ends early is that record's decode error, at once,
    saying where it ended: a count of tags claimed just before the end, either size."""
    decoder = DECODERS["avro record"]
    for count in (5, 2**31):
        began = time.perf_counter()
        with pytest.raises(DecodeError, match="ends at byte"):
            decoder.value(WIRE + b"\x00\x00" + _zigzag(count), "fuzz")
        assert time.perf_counter() - began < PER_INPUT_SECONDS
