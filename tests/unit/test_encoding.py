"""What a processor may return, and how it goes on the wire (offtake.formats.plain)."""

from __future__ import annotations

import datetime
import decimal
import json
import uuid

import pytest

from offtake.formats.errors import DecodeError, UnsendableValueError
from offtake.formats.plain import JsonDecoder, encode_value


def test_plain_values_keep_their_wire_form() -> None:
    assert encode_value(None) is None
    assert encode_value(b"\x00raw") == b"\x00raw"
    assert encode_value("ünï") == "ünï".encode()
    assert json.loads(encode_value({"a": [1, 2.5, True, None]}) or b"") == {
        "a": [1, 2.5, True, None]
    }


def test_dates_decimals_and_uuids_are_sent_as_their_text() -> None:
    ident = uuid.UUID(int=7)
    value = {
        "at": datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC),
        "amount": decimal.Decimal("10.50"),
        "id": ident,
    }
    assert json.loads(encode_value(value) or b"") == {
        "at": "2026-05-01T12:00:00+00:00",
        "amount": "10.50",
        "id": str(ident),
    }


class Opaque:
    pass


def test_an_object_with_no_wire_form_is_an_error_naming_its_type_not_its_repr() -> None:
    # Before: json.dumps(default=str) sent "<...Opaque object at 0x...>" as the record's data.
    with pytest.raises(UnsendableValueError, match=r"test_encoding\.Opaque"):
        encode_value({"nested": Opaque()})
    with pytest.raises(UnsendableValueError):
        encode_value({1, 2})
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(UnsendableValueError, match="JSON"):
        encode_value(loop)


def test_json_the_fast_encoder_refuses_still_goes_out_as_before() -> None:
    # orjson refuses ints beyond 64 bits and non-string keys; the standard library writes them.
    assert json.loads(encode_value({1: 2**70, "k": [2**64]}) or b"") == {"1": 2**70, "k": [2**64]}


def test_json_values_the_fast_decoder_refuses_are_still_read() -> None:
    decode = JsonDecoder().value
    value = decode(b'{"big": 123456789012345678901234567890, "n": NaN}', "t")
    assert value["big"] == 123456789012345678901234567890
    assert value["n"] != value["n"]  # NaN
    with pytest.raises(DecodeError, match="not valid json"):
        decode(b"{", "t")
    with pytest.raises(DecodeError, match=r"not valid json.*utf-8"):
        decode(b'"\xff"', "t")


def test_the_json_encoder_lets_the_kafka_sink_forward_consumed_bytes() -> None:
    """Pass-through forwarding is for a sink without a schema: the JSON encoder's encode is
    the plain function the Kafka sink recognises."""
    from offtake.config.spec import KafkaSinkSpec
    from offtake.formats.resolve import encoder_for
    from offtake.sinks.kafka import KafkaSink

    assert KafkaSink(
        object(),
        "out",
        encoder_for(
            KafkaSinkSpec(topic="out", delivery="at-least-once", format="json", auto_register=False)
        ).encode,
    ).forwards  # type: ignore[arg-type]


def test_a_value_that_cannot_be_encoded_fails_its_record_and_settles_the_batch() -> None:
    """The second of three values of a record has no JSON form: the record fails (once) and
    none of its values is sent (a batch is encoded before any of it is produced), its
    neighbour goes out, and the batch still settles: every value is accounted for, reported or
    refused before it was produced."""
    from collections.abc import Mapping
    from typing import Any

    from offtake.kafka.memory import MemoryBroker
    from offtake.records import Record
    from offtake.sinks.base import SinkBatch, SinkItem
    from offtake.sinks.kafka import KafkaSink

    def item(offset: int, values: list[Any]) -> SinkItem:
        record = Record("in", 0, offset, b"k%d" % offset, None, (), None, b"raw")
        return SinkItem(record, values)

    broker = MemoryBroker()
    broker.create_topic("out", 1)
    sink = KafkaSink(broker.clients().producer({}), "out")
    settled: list[tuple[SinkBatch, Mapping[int, BaseException]]] = []
    sink.start(lambda batch, failed: settled.append((batch, failed)))
    sink.submit(SinkBatch.of([item(0, [{"a": 1}, {1, 2}, {"c": 3}]), item(1, [{"b": 2}])]))
    assert sink.drain(None, 5.0)
    assert [(m.key(), m.value()) for m in broker.records("out")] == [(b"k1", b'{"b":2}')]
    ((batch, failed),) = settled
    assert list(failed) == [0] and "set" in str(failed[0])
    assert batch.offsets == [0, 1]
