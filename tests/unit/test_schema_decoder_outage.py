"""A schema registry that refuses connections is an outage (retried, never the record's fault),
and bytes outside the wire format are the record's fault without asking the registry."""

from __future__ import annotations

import pytest

from offtake.config.spec import SchemaRegistrySpec
from offtake.formats.errors import RegistryUnavailable, SchemaDecodeError
from offtake.formats.resolve import schema_decoder
from offtake.schema_registry import make_client
from offtake_testbed.process import free_port


def test_a_refused_connection_is_an_outage_and_bad_bytes_are_not() -> None:
    client = make_client(SchemaRegistrySpec(f"http://127.0.0.1:{free_port()}"))
    decoder = schema_decoder("avro", client)
    with pytest.raises(RegistryUnavailable, match="schema registry"):
        decoder.value(b"\x00\x00\x00\x00\x07payload", "orders")
    with pytest.raises(SchemaDecodeError) as bad:
        decoder.value(b'{"id": 1}', "orders")
    assert bad.value.headers == {"offtake.schema.id": "", "offtake.error.reason": "not-wire-format"}


def test_the_batch_path_raises_an_outage_and_returns_the_records_fault() -> None:
    """Decoder.records, what the processing stage calls: an outage is raised (the stage waits
    and decodes the poll again), a record's own fault comes back with its record, named."""
    from confluent_kafka import Message

    client = make_client(SchemaRegistrySpec(f"http://127.0.0.1:{free_port()}"))
    decoder = schema_decoder("avro", client)
    poison = Message(topic="orders", partition=2, offset=7, value=b'{"id": 1}')
    needs_registry = Message(topic="orders", partition=2, offset=8, value=b"\x00\x00\x00\x00\x07x")
    ((record, error),) = decoder.records([poison], "orders", 2)
    assert record.value is None and record.raw_value == b'{"id": 1}'
    assert isinstance(error, SchemaDecodeError) and "orders[2]@7" in str(error)
    with pytest.raises(RegistryUnavailable):
        decoder.records([poison, needs_registry], "orders", 2)
