"""A processing function calling the test bed's latency service (offtake_testbed.latency_service)
once per record: the "other service" of the processor.concurrency tests on Kafka (imported by
worker processes too)."""

from __future__ import annotations

import asyncio
import os
from typing import Any
from urllib.parse import quote, urlsplit

from offtake.records import Record

LATENCY_SERVICE_ENV = "OFFTAKE_TEST_LATENCY_SERVICE"  # its URL, http://127.0.0.1:PORT


async def calls_service(record: Record) -> Any:
    """One call per record to the latency service at ``$OFFTAKE_TEST_LATENCY_SERVICE`` with the
    record's key (the service counts calls of one key that overlap); passes the record on with
    where it came from, ``src: [partition, offset]``, and which worker process called, ``pid``.

    The standard library's asyncio streams, a connection per call: the worker's dependencies
    only, and nothing shared between calls that could order them."""
    url = urlsplit(os.environ[LATENCY_SERVICE_ENV])
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        path = "/call?key=" + quote(record.key or b"", safe="")
        writer.write(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        answer = await reader.read()  # the service closes after answering (Connection: close)
    finally:
        writer.close()
    if not answer.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"latency service answered {answer[:80]!r}")
    value = dict(record.value)
    value["src"] = [record.partition, record.offset]
    value["pid"] = os.getpid()
    return value
