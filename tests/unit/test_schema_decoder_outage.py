"""A schema registry that refuses connections is an outage (retried, never the record's fault),
and bytes outside the wire format are the record's fault without asking the registry."""

from __future__ import annotations

import pytest

from offtake.config.spec import SchemaRegistrySpec
from offtake.processing.schema_formats import (
    RegistryUnavailable,
    SchemaDecodeError,
    SchemaValueDecoder,
)
from offtake.schema_registry import make_client
from offtake_testbed.process import free_port


def test_a_refused_connection_is_an_outage_and_bad_bytes_are_not() -> None:
    client = make_client(SchemaRegistrySpec(f"http://127.0.0.1:{free_port()}"))
    decoder = SchemaValueDecoder("avro", client)
    with pytest.raises(RegistryUnavailable, match="schema registry"):
        decoder.decode(b"\x00\x00\x00\x00\x07payload", "orders")
    with pytest.raises(SchemaDecodeError) as bad:
        decoder.decode(b'{"id": 1}', "orders")
    assert bad.value.headers == {"offtake.schema.id": "", "offtake.error.reason": "not-wire-format"}
