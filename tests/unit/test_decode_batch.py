"""A decoder's batch path (one poll's records of a partition at once, its fast per-record
function) reads exactly what its careful one-value path reads, and names the records it cannot."""

from __future__ import annotations

import pytest
from confluent_kafka import Message

from offtake.formats.errors import DecodeError
from offtake.formats.resolve import PLAIN_DECODERS
from offtake.records import Record

VALUES = [
    b'{"id": 1, "name": "\xc3\xbc"}',
    None,  # a tombstone
    b'{"big": 123456789012345678901234567890}',  # beyond orjson: the standard library reads it
    b"not json",
    b'"\xff"',  # not UTF-8
    b"[1, 2.5, true, null]",
]


def messages() -> list[Message]:
    headers = [("h", b"v"), ("empty", None)]
    return [
        Message(
            topic="orders",
            partition=3,
            offset=10 + i,
            key=None if i % 2 else b"k%d" % i,
            value=value,
            headers=headers if i % 3 == 0 else None,
            timestamp=(1, 1_700_000_000_000 + i),
        )
        for i, value in enumerate(VALUES)
    ]


def careful(msg: Message, fmt: str) -> tuple[Record, str | None]:
    raw = msg.value()
    value, error = None, None
    if raw is not None:
        try:
            value = PLAIN_DECODERS[fmt]().value(raw, "orders")
        except DecodeError as exc:
            error = f"record orders[3]@{msg.offset()}: {exc}"
    _, ts = msg.timestamp()
    record = Record(
        "orders", 3, msg.offset() or 0, msg.key(), value, tuple(msg.headers() or ()), ts, raw
    )
    return record, error


@pytest.mark.parametrize("fmt", ["json", "string", "bytes"])
def test_a_batch_decodes_like_one_record_at_a_time(fmt: str) -> None:
    batch = PLAIN_DECODERS[fmt]().records(messages(), "orders", 3)
    one_by_one = [careful(m, fmt) for m in messages()]
    assert [r for r, _ in batch] == [r for r, _ in one_by_one]
    assert [None if e is None else str(e) for _, e in batch] == [e for _, e in one_by_one]
    if fmt == "json":  # the two bad values fail, naming the record; the others are read
        assert [e is not None for _, e in batch] == [False, False, False, True, True, False]
        assert "orders[3]@13" in str(batch[3][1])
