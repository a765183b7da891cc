"""Fuzzing the decoders (issue 38): for any bytes a producer can write, a decoder answers with a
value or that record's DecodeError (never another exception, which would stop the partition),
within a time bound per input (a timer interrupts an input that runs past it, so a hang in
Python fails as that input), without memory growing with the inputs seen. Hypothesis generates
the inputs: random bytes, bytes behind a wire header, varint runs, count and length claims,
arrays of zero-width items claiming huge counts in one block or several, and Protobuf's whole
path (message index, then the message class's parser). A failure prints the shrunk input.

The default suite runs :data:`EXAMPLES` inputs per property, the whole file within 60 s on a
loaded 2-core machine; ``OFFTAKE_FUZZ_LONG=1`` runs the long variant
(:data:`LONG_EXAMPLES` per decoder, minutes), skipped otherwise. A loop in C (fastavro) cannot
be interrupted: the decoders must never hand fastavro a claim (avro_fast's bounds)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.orders_pb import RichOrder, _rich_file

import offtake
from offtake.formats.avro import AvroDecoder
from offtake.formats.base import Decoder
from offtake.formats.errors import DecodeError
from offtake.formats.jsonschema import JsonSchemaDecoder
from offtake.formats.plain import BytesDecoder, JsonDecoder, StringDecoder
from offtake.formats.protobuf import ProtobufDecoder, payload_start

#: Per input, in CPU seconds (a loaded machine stretches wall time, not this): far below what
#: a hostile claim costs unbounded (seconds to minutes, issue 38 item 2).
PER_INPUT_SECONDS = 0.5
#: Memory still held after all of a property's inputs (tracemalloc, Python allocations).
HELD_BYTES = 8 * 1024 * 1024
#: Inputs per property in the default suite (12 properties), and per decoder in the long run.
EXAMPLES = 30
LONG_EXAMPLES = 3000
LONG = os.environ.get("OFFTAKE_FUZZ_LONG") == "1"
FUZZ = settings(
    max_examples=EXAMPLES,
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
    # Zero-width items of every kind (each item takes no byte, so only the value's budget
    # bounds a count: avro_readers.reader_zero_width_array), at the top and inside a record.
    "array of empty records": {
        "type": "array",
        "items": {"type": "record", "name": "Empty", "fields": []},
    },
    "array of zero-size fixed": {
        "type": "array",
        "items": {"type": "fixed", "name": "Nothing", "size": 0},
    },
    "record holding an array of null records": {
        "type": "record",
        "name": "Holder",
        "fields": [
            {
                "name": "items",
                "type": {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "Nulls",
                        "fields": [{"name": "a", "type": "null"}, {"name": "b", "type": "null"}],
                    },
                },
            },
        ],
    },
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
        text = schema if isinstance(schema, str) else json.dumps(schema)
        self._schema = Schema(text, kind)

    def get_schema(self, schema_id: int, **kwargs: Any) -> Schema:
        return self._schema


def _decoders() -> Iterator[tuple[str, Decoder]]:
    for name, schema in AVRO_SCHEMAS.items():
        yield f"avro {name}", AvroDecoder(_OneSchema(schema, "AVRO"))  # type: ignore[arg-type]
    yield "jsonschema", JsonSchemaDecoder(_OneSchema(JSON_SCHEMA, "JSON"))  # type: ignore[arg-type]
    # The registry's serialized form of a Protobuf schema (a FileDescriptorProto, base64): the
    # decoder reads the message index against its nesting, then the body with the class.
    yield "protobuf", ProtobufDecoder(_OneSchema(PROTO_SCHEMA, "PROTOBUF"), RichOrder)  # type: ignore[arg-type]
    yield "json", JsonDecoder()
    yield "string", StringDecoder()
    yield "bytes", BytesDecoder()


PROTO_SCHEMA = base64.b64encode(_rich_file().SerializeToString()).decode()
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
#: An item count of an array: small ones (read) and ones past any value's budget of
#: zero-width items (the floor is 4,096) up to 2**62.
COUNTS = st.one_of(st.integers(0, 1_500), st.integers(2**13, 2**62))


def _blocks(blocks: list[tuple[int, bool]]) -> bytes:
    """Avro array blocks: a count, or (sized) a negative count then the block's byte size, and
    the 0 that ends the array. Zero-width items take no bytes, so a block is its header."""
    out = b"".join(_zigzag(-n) + _zigzag(0) if sized else _zigzag(n) for n, sized in blocks)
    return out + b"\x00"


#: Arrays of zero-width items claiming huge counts, in one block or several (the budget is
#: the whole value's, so blocks under it each can add up past it): issue 38 item 2.
ZERO_WIDTH_ARRAYS = st.lists(st.tuples(COUNTS, st.booleans()), min_size=1, max_size=4).map(
    lambda blocks: WIRE + _blocks(blocks)
)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


#: Protobuf's whole decode path: a message index (a zigzag count, then that many varints,
#: claims and over-long varints among them) and a body: random bytes, or a real RichOrder's
#: bytes cut short or with bytes flipped (so the class's parser and the dict mapping run).
_RICH = RichOrder(
    id=7, customer={"name": "n", "tier": 1}, lines=[{"sku": "a", "qty": 2}], total=1.5
).SerializeToString()
_INDEX = st.one_of(
    st.lists(st.integers(0, 2**64), max_size=4).map(
        lambda ix: _zigzag(len(ix)) + b"".join(_varint(i) for i in ix)
    ),
    CLAIMS.map(lambda b: b[len(WIRE) :]),
    st.binary(min_size=11, max_size=16).map(lambda b: bytes(x | 0x80 for x in b)),
)
_BODY = st.one_of(
    st.binary(max_size=256),
    st.tuples(st.integers(0, len(_RICH)), st.binary(max_size=8)).map(
        lambda cut: _RICH[: cut[0]] + cut[1] + _RICH[cut[0] :]
    ),
    st.integers(0, len(_RICH)).map(lambda n: _RICH[:n]),
)
PROTOBUF = st.tuples(_INDEX, _BODY).map(lambda parts: WIRE + parts[0] + parts[1])
PAYLOADS = st.one_of(PAYLOADS, CLAIMS, ZERO_WIDTH_ARRAYS, PROTOBUF)


class _OverTime(BaseException):
    """One input ran past PER_INPUT_SECONDS (raised in it by a timer, so a hang fails too).
    Not an Exception: the decoders' ``except Exception`` fallbacks (avro_fast's odd bytes go to
    fastavro) must not take it for odd bytes and hand the claim to a loop a timer cannot stop."""


def _over_time(signum: int, frame: Any) -> None:
    raise _OverTime(f"one input ran past {PER_INPUT_SECONDS} s")


def _bounded(call: Any) -> None:
    """``call`` within PER_INPUT_SECONDS: a timer interrupts an input that would run for hours
    (an unbounded count), so the failure is that input's, shrunk by Hypothesis, not the
    suite's timeout."""
    # CPU time, not wall time: what an input costs the worker's processing thread, which a
    # loaded machine does not change (wall time did: 0.72 s for an input of 0.1 s of CPU
    # while the suite ran beside three other jobs). ITIMER_PROF counts the process's CPU.
    previous = signal.signal(signal.SIGPROF, _over_time)
    signal.setitimer(signal.ITIMER_PROF, PER_INPUT_SECONDS)
    began = time.process_time()
    try:
        call()
    except _OverTime:
        # An assertion, so Hypothesis shrinks the input and prints it (a BaseException it
        # would pass straight through, as it does KeyboardInterrupt).
        raise AssertionError(f"past {PER_INPUT_SECONDS} s for one input (interrupted)") from None
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
    took = time.process_time() - began
    assert took < PER_INPUT_SECONDS, f"{took:.3f} s for one input"


@pytest.fixture
def held() -> Iterator[None]:
    """Memory the decoders still hold after the inputs: allocations made from Offtake's own
    code (the innermost frame in the offtake package, C calls made from there included).
    Not the process's total: Hypothesis keeps its own record of every input it tried, which
    grew past the bound with the input count (11-23 MB after 3,000 inputs), decoders or not."""
    package = str(Path(offtake.__file__).parent)
    tracemalloc.start()
    try:
        yield
        ours = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, f"{package}/*")])
        current = sum(stat.size for stat in ours.statistics("filename"))
        assert current < HELD_BYTES, f"{current} bytes still held by the decoders"
    finally:
        tracemalloc.stop()


#: A 12-byte varint (past 64 bits) as an array's count: what this fuzz found fastavro looping
#: on in C for "record holding an array of null records" (its low 64 bits as the count).
OVERLONG_COUNT = bytes.fromhex("e7b3c1d689edd6c0f092ec08")


def _fuzz(decoder: Decoder, examples: int) -> None:
    @settings(FUZZ, max_examples=examples)
    @given(raw=PAYLOADS)
    @example(raw=WIRE + _zigzag(1 << 40) + b"\x00")  # 2**40 zero-width items (issue 38 item 2)
    @example(raw=WIRE + OVERLONG_COUNT + b"\x00")
    def decode(raw: bytes) -> None:
        def one() -> None:
            # A DecodeError is that record's error (the error policy's); anything else fails.
            with contextlib.suppress(DecodeError):
                decoder.value(raw, "fuzz")

        _bounded(one)

    decode()


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_a_decoder_answers_a_value_or_that_records_decode_error(name: str, held: None) -> None:
    _fuzz(DECODERS[name], EXAMPLES)


@pytest.mark.skipif(
    not LONG,
    reason=f"the long fuzz: OFFTAKE_FUZZ_LONG=1 runs {LONG_EXAMPLES} inputs per decoder "
    f"(minutes); the default suite runs {EXAMPLES} per decoder",
)
@pytest.mark.parametrize("name", sorted(DECODERS))
def test_the_long_fuzz_of_a_decoder(name: str, held: None) -> None:
    _fuzz(DECODERS[name], LONG_EXAMPLES)


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
        began = time.process_time()
        with pytest.raises(DecodeError, match="ends at byte"):
            decoder.value(WIRE + b"\x00\x00" + _zigzag(count), "fuzz")
        assert time.process_time() - began < PER_INPUT_SECONDS


def test_an_overlong_count_of_zero_width_items_is_that_records_error_at_once() -> None:
    """avro_fast leaves a varint past 64 bits to fastavro, which keeps its low 64 bits; as a
    count of zero-width items that is a loop in C no timer stops (the long fuzz hung on it).
    In a value with zero-width items it is the record's decode error, at once."""
    for name in ("avro array of nulls", "avro record holding an array of null records"):
        began = time.process_time()
        with pytest.raises(DecodeError, match="varint past 64 bits"):
            DECODERS[name].value(WIRE + OVERLONG_COUNT + b"\x00", "fuzz")
        assert time.process_time() - began < PER_INPUT_SECONDS
