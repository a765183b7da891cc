"""Processing functions used by the tests' pipelines (imported by worker processes too)."""

from __future__ import annotations

import os
import time
from typing import Any

from offtake.records import Record


def tag(record: Record) -> dict[str, Any]:
    """Pass the record on, noting where it came from (lets tests check provenance)."""
    value = dict(record.value)
    value["src"] = f"{record.partition}:{record.offset}"
    return value


def poison(record: Record) -> Any:
    """Fails on records whose value says poison; counts attempts in a file if asked to."""
    if isinstance(record.value, dict) and record.value.get("poison"):
        counter = os.environ.get("OFFTAKE_TEST_ATTEMPTS_FILE")
        if counter:
            with open(counter, "a") as f:
                f.write(f"{record.offset}\n")
        raise ValueError(f"poison record {record.value.get('id')}")
    return record.value


def slow(record: Record) -> Any:
    """Takes a while per record, so that work is in flight when a test stops the worker."""
    time.sleep(float(os.environ.get("OFFTAKE_TEST_SLOW_SECONDS", "0.002")))
    return record.value


def poison_until_fixed(record: Record) -> Any:
    """Fails on poison records until the file $OFFTAKE_TEST_FIXED_FILE exists: a bug, then its
    fix (what a dead-letter redrive is for)."""
    fixed = os.environ.get("OFFTAKE_TEST_FIXED_FILE")
    if fixed and os.path.exists(fixed):
        return {**record.value, "fixed": True}
    return poison(record)


def fails_twice(record: Record) -> Any:
    """Fails records marked flaky on their first two attempts, records marked poison always.

    Each attempt at a marked record appends "id topic wall-clock-time" to
    $OFFTAKE_TEST_ATTEMPTS_FILE (the worker is another process: the file is the memory across
    attempts). Every result carries the wall-clock time it was processed at, ``at``.
    """
    value = dict(record.value)
    if value.get("flaky") or value.get("poison"):
        path = os.environ["OFFTAKE_TEST_ATTEMPTS_FILE"]
        with open(path, "a+") as f:
            f.seek(0)
            before = sum(1 for line in f if line.split()[0] == str(value["id"]))
            f.write(f"{value['id']} {record.topic} {time.time():.6f}\n")
        if value.get("poison") or before < 2:
            raise ValueError(f"record {value['id']} failed on attempt {before + 1}")
    value["at"] = time.time()
    return value


def inflate(record: Record) -> Any:
    """Records marked big come out as ~2 MB values: larger than the output's message.max.bytes."""
    if isinstance(record.value, dict) and record.value.get("big"):
        return {**record.value, "blob": "x" * 2_000_000}
    return record.value


class _Unsendable:
    """Not JSON, not bytes, not str: a value no sink can serialise."""


def misbehave(record: Record) -> Any:
    """Raises on every 7th id, returns an unsendable object on every 11th, passes the rest."""
    ident = record.value.get("id", 0) if isinstance(record.value, dict) else 0
    if ident % 7 == 0:
        raise RuntimeError(f"processor failure on record {ident}")
    if ident % 11 == 0:
        return _Unsendable()
    return record.value


def fan_out(record: Record) -> Any:
    """One record becomes ``id % 4 + 1`` values (a list); records marked poison fail.

    Multi-value items of different sizes side by side in one batch, and per-record failures
    among them (tests/worker/test_engine_stress_on_kafka.py).
    """
    value = record.value
    if value.get("poison"):
        raise ValueError(f"poison record {value['id']}")
    return [{"id": value["id"], "part": k} for k in range(value["id"] % 4 + 1)]


def fan_out_batch(records: list[Record]) -> list[Any]:
    """``fan_out`` for ``processor.batch: true``: one result per record, in order.

    A poison record with an even id comes back as an exception instance (that record fails);
    one with an odd id makes the whole call raise (the engine then calls again per record).
    """
    results: list[Any] = []
    for record in records:
        value = record.value
        if value.get("poison") and value["id"] % 2:
            raise ValueError(f"poison record {value['id']}")
        if value.get("poison"):
            results.append(ValueError(f"poison record {value['id']}"))
        else:
            results.append([{"id": value["id"], "part": k} for k in range(value["id"] % 4 + 1)])
    return results


SLOW_DOWN_ATTEMPTS: dict[int, list[float]] = {}  # id -> wall-clock times of each attempt


def saturated(record: Record) -> Any:
    """Raises offtake.Backpressure(retry_after=1) on the first two attempts at records marked
    ``saturate`` (its downstream is "saturated"); notes every attempt's time (in-process)."""
    from offtake import Backpressure

    value = record.value
    if value.get("saturate"):
        attempts = SLOW_DOWN_ATTEMPTS.setdefault(value["id"], [])
        attempts.append(time.time())
        if len(attempts) <= 2:
            raise Backpressure(retry_after=1.0)
    return {**value, "at": time.time()}


def with_pid(record: Record) -> Any:
    """The record with the id of the process that handled it (processor.parallelism)."""
    return {**record.value, "pid": os.getpid()}


def hang_on_marked(record: Record) -> Any:
    """Never returns on records marked ``hang`` (processor.timeoutSeconds must end the call);
    the others come back with the id of the process that handled them."""
    if isinstance(record.value, dict) and record.value.get("hang"):
        while True:  # a hung call: no exception, no return, in a loop a thread cannot leave
            time.sleep(3600)
    return {**record.value, "pid": os.getpid()}


def hang_on_marked_batch(records: list[Record]) -> list[Any]:
    """``hang_on_marked`` for ``processor.batch: true``: a batch holding a marked record hangs."""
    return [hang_on_marked(r) for r in records]


def die_on_marked(record: Record) -> Any:
    """Ends its own process abruptly on records marked ``die`` (a crash in native code)."""
    if isinstance(record.value, dict) and record.value.get("die"):
        os._exit(3)
    return {**record.value, "pid": os.getpid()}


_LEAKED: list[bytes] = []


def leak(record: Record) -> Any:
    """Keeps $OFFTAKE_TEST_LEAK_KIB KiB (default 512) of every record it sees, for good: a
    leak. Returns the record with the id of the process that handled it."""
    _LEAKED.append(os.urandom(1024 * int(os.environ.get("OFFTAKE_TEST_LEAK_KIB", "512"))))
    return {**record.value, "pid": os.getpid()}


def refuse_ids(record: Record) -> Any:
    """Fails on records whose ``id`` is in $OFFTAKE_TEST_REFUSED_IDS (comma-separated)."""
    refused = {int(i) for i in os.environ.get("OFFTAKE_TEST_REFUSED_IDS", "").split(",") if i}
    if isinstance(record.value, dict) and record.value.get("id") in refused:
        raise ValueError(f"order {record.value['id']} refused")
    return record.value


# -- calls that wait, with lanes (processor.concurrency): what started, in order -------------------
WAITING_CALLS: list[tuple[bytes | None, int, int]] = []  # (key, partition, offset) as started
_IN_FLIGHT: set[bytes | None] = set()
WAITING_OVERLAPS: list[bytes | None] = []  # keys that had a call start while one was in flight


async def waits(record: Record) -> Any:
    """Waits 2 ms, as a call to another service does; records each call's start in order."""
    import asyncio

    key = record.key
    if key in _IN_FLIGHT:
        WAITING_OVERLAPS.append(key)
    _IN_FLIGHT.add(key)
    WAITING_CALLS.append((key, record.partition, record.offset))
    try:
        await asyncio.sleep(0.002)
    finally:
        _IN_FLIGHT.discard(key)
    return record.value
