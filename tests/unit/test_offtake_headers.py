"""Hostile headers through the strict header readers, the DLQ header builder and the retry
route: nothing a producer writes crashes them, and a dead letter carries exactly one copy of
each of Offtake's headers, Offtake's (issue 23, item 6)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offtake.engine.dead_letters import (
    H_ATTEMPTS,
    H_OFFSET,
    H_PARTITION,
    H_RETRY_DUE,
    H_TIMESTAMP,
    H_TOPIC,
    PRODUCER_PREFIX,
    dlq_headers,
    read_origin,
)
from offtake.engine.header_values import (
    MAX_INT64,
    MAX_PARTITION,
    HeaderError,
    read_int,
    read_partition,
    read_topic,
)
from offtake.engine.retry_topics import RetryRoute
from offtake.records import Record

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

OFFTAKE_NAMES = [
    H_TOPIC,
    H_PARTITION,
    H_OFFSET,
    H_TIMESTAMP,
    H_ATTEMPTS,
    H_RETRY_DUE,
    "offtake.error.class",
    "offtake.error.message",
    "offtake.redrive.id",
    "offtake.anything",
]
# What a hostile producer writes: digits that are not ASCII, signs, huge numbers, empty,
# very long, invalid UTF-8.
HOSTILE_VALUES = st.one_of(
    st.binary(max_size=64),
    st.binary(min_size=5000, max_size=9000),
    st.sampled_from(
        [
            b"",
            b"-1",
            b"+1",
            b" 1",
            b"1 ",
            b"\xff",
            b"\xb2",
            "\u00b2".encode(),  # SUPERSCRIPT TWO: isdigit(), and int() refuses it
            "\u0661".encode(),  # ARABIC-INDIC DIGIT ONE: isdigit(), yet not ASCII
            b"99999999999",
            b"9" * 19,
            b"9" * 5000,
            b"1e3",
            b"0x10",
            b"1_000",
            b"..",
            b".",
        ]
    ),
    st.integers(min_value=-(2**70), max_value=2**70).map(lambda i: str(i).encode()),
    st.text(max_size=40).map(lambda t: t.encode("utf-8")),
)
HEADERS = st.lists(
    st.tuples(
        st.one_of(st.sampled_from(OFFTAKE_NAMES), st.text(max_size=20)),
        st.one_of(st.none(), HOSTILE_VALUES),
    ),
    max_size=12,
)


def record(topic: str, headers: list[tuple[str, bytes | None]]) -> Record:
    return Record(topic, 2, 41, b"k", None, tuple(headers), 1_700_000_000_000, b"v")


@FAST
@given(HEADERS)
def test_the_readers_return_a_valid_value_or_a_header_error_naming_the_header(
    headers: list[tuple[str, bytes | None]],
) -> None:
    for name in OFFTAKE_NAMES:
        for reader, top in ((read_int, MAX_INT64), (read_partition, MAX_PARTITION)):
            try:
                value = reader(headers, name)
            except HeaderError as exc:
                assert str(exc).startswith(f"header {name}: ")
                assert len(str(exc)) < 300  # a very long value is never echoed whole
            else:
                assert value is None or 0 <= value <= top
        try:
            topic = read_topic(headers, name)
        except HeaderError as exc:
            assert exc.name == name
        else:
            assert topic is None or (0 < len(topic) <= 249 and topic not in (".", ".."))
    try:
        read_origin(headers)
    except HeaderError as exc:
        assert exc.name.startswith("offtake.original.")


@pytest.mark.parametrize(
    "raw", [b"99999999999", b"-1", b"\xff", "²".encode(), b"", b" 3", b"9" * 5000, b"2147483648"]
)
def test_a_crafted_partition_is_refused_by_name(raw: bytes) -> None:
    headers = [(H_TOPIC, b"orders"), (H_PARTITION, raw)]
    if raw == b"":  # empty: not known (Offtake writes "" for a missing timestamp, never here)
        assert read_origin(headers) is not None
        return
    with pytest.raises(HeaderError, match=r"^header offtake\.original\.partition: "):
        read_origin(headers)


def test_the_last_copy_is_read() -> None:
    headers = [(H_TOPIC, b"forged"), (H_PARTITION, b"7"), (H_TOPIC, b"orders"), (H_PARTITION, b"1")]
    origin = read_origin(headers)
    assert origin is not None and (origin.topic, origin.partition) == ("orders", 1)


@FAST
@given(HEADERS, st.booleans())
def test_a_dead_letter_carries_exactly_one_copy_of_offtakes_headers_and_loses_nothing(
    headers: list[tuple[str, bytes | None]], retried: bool
) -> None:
    rec = record("orders", headers)
    out = dlq_headers(rec, ValueError("boom"), 3, "process", retried=retried)
    names = Counter(k for k, _ in out)
    for name in (H_TOPIC, H_PARTITION, H_OFFSET, H_TIMESTAMP, H_ATTEMPTS):
        assert names[name] == 1, name
    for name, count in names.items():
        if name.startswith("offtake.") and not name.startswith("offtake.redrive."):
            assert count == 1, name
    origin = read_origin(out)  # what the worker wrote always reads back strictly
    assert origin is not None
    if not retried:
        # The record's own coordinates, whatever the producer wrote.
        assert (origin.topic, origin.partition, origin.offset) == ("orders", 2, 41)
        assert origin.timestamp == 1_700_000_000_000
        # Nothing the producer set is lost: in order, under its own name, or, for its own
        # offtake.* headers (but the last copy of each offtake.redrive.*), under producer.*.
        ours = len(dlq_headers(record("orders", []), ValueError("boom"), 3, "process"))
        carried = out[: len(out) - ours]
        restored = [
            (
                k.removeprefix(PRODUCER_PREFIX)
                if k.startswith(PRODUCER_PREFIX + "offtake.")
                else k,
                v,
            )
            for k, v in carried
        ]
        assert restored == headers


def test_a_forged_origin_on_a_source_record_is_moved_aside() -> None:
    forged = [(H_TOPIC, b"payments"), (H_PARTITION, b"0"), (H_OFFSET, b"5"), ("trace", b"t1")]
    out = dlq_headers(record("orders", forged), ValueError("boom"), 1, "process")
    assert out[:4] == [
        ("producer.offtake.original.topic", b"payments"),
        ("producer.offtake.original.partition", b"0"),
        ("producer.offtake.original.offset", b"5"),
        ("trace", b"t1"),
    ]
    origin = read_origin(out)
    assert origin is not None and (origin.topic, origin.partition, origin.offset) == (
        "orders",
        2,
        41,
    )


def test_a_retry_record_with_a_bad_origin_keeps_its_own_coordinates() -> None:
    bad = [(H_TOPIC, b"orders"), (H_PARTITION, b"\xff"), (H_ATTEMPTS, b"2")]
    out = dlq_headers(record("orders.retry-10s", bad), ValueError("x"), 1, "process", retried=True)
    origin = read_origin(out)
    assert origin is not None and (origin.topic, origin.partition) == ("orders.retry-10s", 2)


@FAST
@given(HOSTILE_VALUES, st.integers(min_value=0, max_value=2**41))
def test_retry_headers_never_crash_skip_or_hold_a_partition_past_its_delay(
    raw: bytes, stamp: int
) -> None:
    route = RetryRoute(["orders"], [10, 60], max_retries=3)
    rec = Record("orders.retry-60s", 0, 9, None, None, ((H_ATTEMPTS, raw),), stamp, b"v")
    prior = route.prior_attempts(rec)
    assert 0 <= prior <= 2 * 4  # two topics before this hop's end, four tries each at most
    due = route.due_ms("orders.retry-60s", [(H_RETRY_DUE, raw)], stamp)
    assert due is not None and 0 <= due <= stamp + 60_000
    unstamped = route.due_ms("orders.retry-60s", [(H_RETRY_DUE, raw)], None)
    assert unstamped is None or 0 <= unstamped <= MAX_INT64
