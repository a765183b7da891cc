"""The latency service on its own: it answers no sooner than its latency, and counts the calls of
one key that overlap (the check bench/concurrency.py relies on for key order)."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from offtake_testbed.latency_service import LatencyService

LATENCY_MS = 50.0


@pytest.fixture(scope="module")
def service() -> Iterator[LatencyService]:
    with LatencyService(LATENCY_MS) as running:
        yield running


def _call(service: LatencyService, query: str) -> bytes:
    with urllib.request.urlopen(f"{service.url}/call?{query}", timeout=30) as answer:
        body: bytes = answer.read()
        return body


def _until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_answers_after_its_latency_and_counts_calls(service: LatencyService) -> None:
    service.reset(LATENCY_MS)
    began = time.monotonic()
    assert _call(service, "key=a") == b"ok"
    assert time.monotonic() - began >= LATENCY_MS / 1000
    began = time.monotonic()
    _call(service, "key=a&ms=120")  # a call's own latency
    assert time.monotonic() - began >= 0.12
    stats = service.stats()
    assert (stats.served, stats.overlaps, stats.in_flight) == (2, 0, 0)
    assert stats.latency_ms == LATENCY_MS


def test_counts_a_call_that_starts_while_its_key_is_in_flight(service: LatencyService) -> None:
    service.reset(LATENCY_MS)
    # A long call of key k holds it; the service's own count says when it is in flight, so
    # the next calls start during it whatever the machine's load.
    holder = threading.Thread(target=_call, args=(service, "key=k&ms=5000"))
    holder.start()
    try:
        _until(lambda: service.stats().in_flight == 1)
        _call(service, "key=other&ms=0")  # another key: no overlap
        _call(service, "key=k&ms=0")  # the same key: one overlap
        _call(service, "key=k&ms=0")  # and another
        stats = service.stats()
        assert stats.overlaps == 2
        assert stats.in_flight == 1
        assert stats.in_flight_max == 2
        assert stats.keys_in_flight_max == 2
    finally:
        holder.join(30)
    stats = service.stats()
    assert (stats.served, stats.in_flight) == (4, 0)


def test_reset_answers_the_counts_before_it(service: LatencyService) -> None:
    service.reset(LATENCY_MS)
    _call(service, "key=x&ms=0")
    before = service.reset(20)
    assert before.served == 1
    after = service.stats()
    assert (after.served, after.overlaps, after.latency_ms) == (0, 0, 20)


def test_a_call_without_a_key_is_refused(service: LatencyService) -> None:
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{service.url}/call", timeout=30)
    assert refused.value.code == 400
