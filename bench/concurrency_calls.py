"""The per-record call of bench/concurrency.py, written once and called by every Python contender.

Each record costs one call to the latency service (offtake_testbed.latency_service) at the URL
in ``$OFFTAKE_BENCH_SERVICE``, with the record's key in the query (the service counts calls of
one key that overlap). Two ways to call, as users write them:

- threads: the standard library's http.client, one keep-alive connection per thread (Offtake's
  ``def`` function on its threads, Arroyo's RunTaskInThreads);
- async: one aiohttp ClientSession, no limit of its own on connections (the caller's
  concurrency is the limit) (Offtake's ``async def`` function on its event loop, and the bare
  asyncio client that measures the ceiling).

Only the standard library is imported at the top: Arroyo runs this file from its own
virtualenv, which has neither offtake nor aiohttp.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import threading
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote, urlsplit

SERVICE_ENV = "OFFTAKE_BENCH_SERVICE"


def service_url() -> str:
    url = os.environ.get(SERVICE_ENV)
    if not url:
        raise RuntimeError(f"${SERVICE_ENV} must hold the latency service's URL")
    return url.rstrip("/")


def call_path(key: bytes | None) -> str:
    """The call's path and query for a record key (a null key: the empty key)."""
    return "/call?key=" + quote(key or b"", safe="")


# -- threads: http.client, a connection per thread --------------------------------------------
_local = threading.local()


def _connection() -> http.client.HTTPConnection:
    conn: http.client.HTTPConnection | None = getattr(_local, "conn", None)
    if conn is None:
        split = urlsplit(service_url())
        conn = http.client.HTTPConnection(split.hostname or "127.0.0.1", split.port, timeout=60)
        _local.conn = conn
    return conn


def call_sync(key: bytes | None) -> None:
    """One call, answered 200, on this thread's keep-alive connection (reopened once if the
    service closed it)."""
    for attempt in (1, 2):
        conn = _connection()
        try:
            conn.request("GET", call_path(key))
            answer = conn.getresponse()
            answer.read()
        except (ConnectionError, http.client.HTTPException):
            conn.close()
            _local.conn = None
            if attempt == 2:
                raise
            continue
        if answer.status != 200:
            raise RuntimeError(f"latency service answered {answer.status}")
        return


# -- async: one aiohttp session ---------------------------------------------------------------
_session: Any = None  # aiohttp.ClientSession, opened by http_session() (or the first call)


@contextlib.asynccontextmanager
async def http_session() -> AsyncIterator[None]:
    """Offtake's ``processor.lifespan``: the session every call of the worker shares, opened
    on the worker's event loop before the first record and closed at shutdown."""
    import aiohttp

    global _session
    # limit=0: no connection cap of aiohttp's own (its default is 100), so that the worker's
    # concurrency, not the session, bounds the calls in flight.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        _session = session
        try:
            yield
        finally:
            _session = None


async def call_async(key: bytes | None) -> None:
    global _session
    if _session is None:  # an engine without processor.lifespan: opened on first use
        import aiohttp

        _session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    async with _session.get(service_url() + call_path(key)) as answer:
        await answer.read()
        if answer.status != 200:
            raise RuntimeError(f"latency service answered {answer.status}")


# -- Offtake's processor.function (called with an offtake Record) ------------------------------
def offtake_sync(record: Any) -> bytes:
    call_sync(record.key)
    return bytes(record.value)


async def offtake_async(record: Any) -> bytes:
    await call_async(record.key)
    return bytes(record.value)
