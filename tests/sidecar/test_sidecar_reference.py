"""SidecarProcessor against the reference processors (Python and Go), running as subprocesses."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from sidecar_helpers import References

from offtake.processing.base import ProcessorUnavailable
from offtake.processing.sidecar import (
    SidecarProcessor,
    SidecarProtocolError,
    SidecarUnavailable,
)
from offtake.processing.sidecar_wire import SidecarRecordError
from offtake.records import Record
from offtake_testbed.process import free_port

Make = Callable[..., SidecarProcessor]


def rec(
    value: Any,
    offset: int = 0,
    *,
    key: bytes | None = b"k",
    topic: str = "orders",
    partition: int = 0,
    headers: tuple[tuple[str, bytes | None], ...] = (),
    timestamp: int | None = 1_767_225_600_000,
) -> Record:
    return Record(topic, partition, offset, key, value, headers, timestamp)


def test_a_batch_round_trips_split_at_max_batch_records(
    references: References, processors: Make
) -> None:
    ref = references.start()
    p = processors(ref.port, max_batch_records=3)
    records = [rec({"n": i, "name": f"user{i}"}, offset=i, partition=i % 2) for i in range(10)]

    outcomes = p.process(records)

    assert [o.values for o in outcomes] == [
        [{"n": i, "name": f"USER{i}", "processedBy": "example-sidecar"}] for i in range(10)
    ]
    assert all(o.ok for o in outcomes)
    assert p.stats.requests == 4  # 3 + 3 + 3 + 1
    assert p.stats.records == 10


def test_a_poison_record_fails_alone(references: References, processors: Make) -> None:
    ref = references.start()
    p = processors(ref.port)
    records = [rec({"n": i, "poison": i == 2}, offset=i) for i in range(5)]

    outcomes = p.process(records)

    bad = outcomes[2]
    assert not bad.ok and bad.values == [] and bad.retriable is False
    assert isinstance(bad.error, SidecarRecordError)
    assert bad.error.error_type == "PoisonRecord"
    assert bad.error.record_id == "orders/0/2"
    assert "orders/0/2" in str(bad.error)
    assert [o.ok for o in outcomes] == [True, True, False, True, True]
    assert outcomes[3].values == [{"n": 3, "poison": False, "processedBy": "example-sidecar"}]


def test_drop_and_fan_out(references: References, processors: Make) -> None:
    ref = references.start()
    p = processors(ref.port)

    dropped, split, scalar, tombstone = p.process(
        [
            rec({"drop": True}, 0),
            rec({"split": [1, 2, 3]}, 1),
            rec(42, 2),
            rec(None, 3),
        ]
    )

    assert dropped.ok and dropped.values == []
    assert [v["part"] for v in split.values] == [1, 2, 3]
    assert all(v["processedBy"] == "example-sidecar" for v in split.values)
    assert scalar.values == [42]
    assert tombstone.values == [None]


def echoed(p: SidecarProcessor, records: list[Record]) -> list[dict[str, Any]]:
    """What the sidecar received for each record (reference processor in echo mode)."""
    outcomes = p.process(records)
    assert all(o.ok and len(o.values) == 1 for o in outcomes), outcomes
    return [o.values[0] for o in outcomes]


BINARY = bytes(range(256))
HEADERS: tuple[tuple[str, bytes | None], ...] = (
    ("trace", b"abc"),
    ("bin", b"\xff\x00\xfe"),
    ("empty", b""),
    ("none", None),
    ("trace", b"2"),
)


@pytest.mark.parametrize(
    "fmt, value, wire",
    [
        ("json", {"a": [1, 2.5, None, True], "s": "é ✓ \u0000", "big": 2**62}, "value"),
        ("string", "héllo ✓\nnext line", "value"),
        ("bytes", BINARY, "valueBase64"),
    ],
)
def test_every_format_carries_keys_values_and_headers_exactly(
    references: References, processors: Make, fmt: str, value: Any, wire: str
) -> None:
    ref = references.start("--mode", "echo")
    p = processors(ref.port, fmt)
    records = [
        rec(value, 7, key=b"customer-17", headers=HEADERS, topic="t.x-1", partition=11),
        rec(value, 8, key=b"\xff\xfebinary", timestamp=None),
        rec(value, 9, key=None),
        rec(None, 10, key=b""),  # a tombstone with an empty (not absent) key
    ]

    first, binary_key, no_key, tombstone = echoed(p, records)

    expected_value = base64.b64encode(value).decode() if fmt == "bytes" else value
    assert first == {
        "id": "t.x-1/11/7",
        "topic": "t.x-1",
        "partition": 11,
        "offset": 7,
        "timestamp": 1_767_225_600_000,
        "key": "customer-17",
        "keyBase64": base64.b64encode(b"customer-17").decode(),
        wire: expected_value,
        "headers": [
            {"key": "trace", "value": "abc", "valueBase64": "YWJj"},
            {"key": "bin", "value": None, "valueBase64": "/wD+"},
            {"key": "empty", "value": "", "valueBase64": ""},
            {"key": "none", "value": None, "valueBase64": None},
            {"key": "trace", "value": "2", "valueBase64": "Mg=="},
        ],
    }
    assert (binary_key["key"], binary_key["keyBase64"]) == (None, "//5iaW5hcnk=")
    assert binary_key["timestamp"] is None
    assert (no_key["key"], no_key["keyBase64"]) == (None, None)
    assert (tombstone["key"], tombstone["keyBase64"]) == ("", "")
    assert tombstone[wire] is None
    assert "value" not in first if fmt == "bytes" else "valueBase64" not in first


def test_values_come_back_exactly_in_every_format(references: References, processors: Make) -> None:
    ref = references.start()
    text = "héllo ✓ wörld"
    [as_bytes] = processors(ref.port, "bytes").process([rec(BINARY)])
    [as_string] = processors(ref.port, "string").process([rec(text)])
    [big] = processors(ref.port, "json").process([rec({"id": 2**62 + 1, "x": 0.1})])

    assert as_bytes.values == [BINARY]
    assert as_string.values == [text.upper()]
    assert big.values == [{"id": 2**62 + 1, "x": 0.1, "processedBy": "example-sidecar"}]


def test_a_slow_processor_is_unavailable_after_the_timeout(
    references: References, processors: Make
) -> None:
    ref = references.start("--delay", "3")
    p = processors(ref.port, timeout_seconds=0.5)

    began = time.monotonic()
    with pytest.raises(ProcessorUnavailable, match=r"did not answer within 0\.5s"):
        p.process([rec({"n": 1})])
    assert time.monotonic() - began < 2.0
    assert p.stats.unavailable == 1


def test_not_started_is_unavailable_then_works_once_started(
    references: References, processors: Make
) -> None:
    port = free_port()
    p = processors(port)

    with pytest.raises(SidecarUnavailable, match=rf"127\.0\.0\.1:{port} refused the connection"):
        p.process([rec({"n": 1})])

    references.start(port=port)
    [outcome] = p.process([rec({"n": 1})])
    assert outcome.ok


def test_wait_ready_waits_for_a_processor_that_starts_late(
    references: References, processors: Make
) -> None:
    references.command(0)  # skips early when the language's toolchain is missing
    port = free_port()
    p = processors(port)
    starter = threading.Timer(0.5, lambda: references.start(port=port))
    starter.start()
    try:
        began = time.monotonic()
        assert p.wait_ready(timeout=20) is True
        assert 0.4 < time.monotonic() - began < 20
    finally:
        starter.join()
    assert p.process([rec({"n": 1})])[0].ok


def test_wait_ready_times_out_naming_the_problem(
    processors: Make, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    p = processors(port)
    assert p.wait_ready(timeout=0.3) is False
    expected = f"sidecar at 127.0.0.1:{port} not ready after 0.3s: connection refused"
    assert p.not_ready_reason == expected
    assert expected in caplog.text


def test_wait_ready_returns_false_when_aborted(processors: Make) -> None:
    p = processors(free_port())
    abort = threading.Event()
    threading.Timer(0.2, abort.set).start()
    began = time.monotonic()
    assert p.wait_ready(timeout=30, abort=abort) is False
    assert time.monotonic() - began < 2


def test_a_restarted_processor_is_reached_on_a_fresh_connection(
    python_references: References, processors: Make
) -> None:
    ref = python_references.start()
    p = processors(ref.port)
    assert p.process([rec({"n": 1})])[0].ok  # opens the keep-alive connection

    ref.stop()
    python_references.start(port=ref.port)

    # The old connection is dead; the request is sent again on a new one, invisibly.
    assert p.process([rec({"n": 2})])[0].ok
    assert p.stats.reconnects == 1


def test_a_wrong_path_is_a_protocol_error_not_a_record_error(
    references: References, processors: Make
) -> None:
    ref = references.start()
    p = processors(ref.port, path="/v2/wrong")
    with pytest.raises(SidecarProtocolError, match=r"\(404\) \(is spec.processor.container.path"):
        p.process([rec({"n": 1})])
    assert p.stats.protocol_errors == 1


def test_the_reference_stops_cleanly_on_sigterm(references: References) -> None:
    ref = references.start()
    ref.stop()
    assert ref.proc.returncode == 0
