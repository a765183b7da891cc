"""SidecarProcessor against a scripted sidecar: every answer the protocol allows or forbids."""

from __future__ import annotations

import email.utils
import json
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from sidecar_helpers import Answer, FakeSidecar, Script, ok

from offtake.processing.base import ProcessorUnavailable
from offtake.processing.sidecar import (
    MAX_RETRY_AFTER,
    SidecarBusy,
    SidecarProcessor,
    SidecarProtocolError,
    SidecarUnavailable,
    parse_retry_after,
)
from offtake.processing.sidecar_wire import SidecarRecordError, record_to_wire
from offtake.records import Record

Make = Callable[..., SidecarProcessor]
Fake = Callable[[Script], FakeSidecar]


def rec(value: Any, offset: int = 0) -> Record:
    return Record("orders", 0, offset, b"k", value, (), 1)


def batch(n: int) -> list[Record]:
    return [rec({"n": i}, i) for i in range(n)]


def echo_values(b: dict[str, Any]) -> Answer:
    return ok([{"id": r["id"], "values": [r["value"]]} for r in b["records"]])


def error_of(outcome: Any) -> SidecarRecordError:
    assert not outcome.ok and outcome.values == []
    assert isinstance(outcome.error, SidecarRecordError)
    return outcome.error


def test_the_request_follows_the_protocol(fake_sidecar: Fake, processors: Make) -> None:
    fake = fake_sidecar(echo_values)
    p = processors(fake.port, path="/custom")

    p.process(batch(2))

    method, path, headers = fake.requests[0]
    assert (method, path) == ("POST", "/custom")
    assert headers["Content-Type"] == "application/json"
    assert headers["Offtake-Protocol"] == "1"
    assert fake.batches[0]["version"] == 1
    assert fake.batches[0]["format"] == "json"
    assert [r["id"] for r in fake.batches[0]["records"]] == ["orders/0/0", "orders/0/1"]


def test_batches_reuse_one_keep_alive_connection(fake_sidecar: Fake, processors: Make) -> None:
    ports: set[int] = set()
    fake = fake_sidecar(echo_values)
    p = processors(fake.port)
    for _ in range(5):
        p.process(batch(1))
        conn = p._local.conn  # this thread's connection
        assert conn is not None and conn.sock is not None
        ports.add(conn.sock.getsockname()[1])
    assert len(ports) == 1


def test_concurrent_calls_each_use_their_own_connection(
    fake_sidecar: Fake, processors: Make
) -> None:
    """processor.concurrency: calls from several threads at once, each on its own keep-alive
    connection, each with its own answers."""
    fake = fake_sidecar(echo_values)
    p = processors(fake.port)
    results: dict[int, list[Any]] = {}

    def call(n: int) -> None:
        results[n] = [o.values for o in p.process([rec({"n": n, "i": i}, i) for i in range(3)])]

    threads = [threading.Thread(target=call, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {n: [[{"n": n, "i": i}] for i in range(3)] for n in range(8)}
    p.close()


def test_connection_close_is_honoured(fake_sidecar: Fake, processors: Make) -> None:
    def closing(b: dict[str, Any]) -> Answer:
        status, _, body = echo_values(b)
        return status, {"Connection": "close"}, body

    p = processors(fake_sidecar(closing).port)
    for i in range(3):
        assert p.process(batch(2))[1].values == [{"n": 1}], i
    assert p.stats.reconnects == 0  # closed cleanly by the answer, not found dead later


def test_results_are_matched_by_id_in_any_order(fake_sidecar: Fake, processors: Make) -> None:
    def reversed_(b: dict[str, Any]) -> Answer:
        return ok([{"id": r["id"], "values": [r["value"]["n"]]} for r in reversed(b["records"])])

    p = processors(fake_sidecar(reversed_).port)
    assert [o.values for o in p.process(batch(4))] == [[0], [1], [2], [3]]


@pytest.mark.parametrize("status", [429, 503])
def test_backpressure_carries_retry_after(
    fake_sidecar: Fake, processors: Make, status: int
) -> None:
    fake = fake_sidecar(lambda b: (status, {"Retry-After": "2"}, b"busy"))
    p = processors(fake.port)

    with pytest.raises(SidecarBusy) as caught:
        p.process(batch(3))

    assert isinstance(caught.value, ProcessorUnavailable)  # the engine retries the whole batch
    assert caught.value.retry_after == 2.0
    assert caught.value.status == status
    assert "retry after 2s" in str(caught.value) and "3 record(s)" in str(caught.value)
    assert p.stats.busy == 1


def test_retry_after_as_an_http_date_and_capped(fake_sidecar: Fake, processors: Make) -> None:
    when = email.utils.formatdate(time.time() + 10, usegmt=True)
    fake = fake_sidecar(lambda b: (503, {"Retry-After": when}, b""))
    with pytest.raises(SidecarBusy) as caught:
        processors(fake.port).process(batch(1))
    assert caught.value.retry_after is not None and 8 <= caught.value.retry_after <= 10

    assert parse_retry_after("86400") == MAX_RETRY_AFTER
    assert parse_retry_after("-5") == 0.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None
    assert parse_retry_after(email.utils.formatdate(0, usegmt=True)) == 0.0


def test_backpressure_without_retry_after(fake_sidecar: Fake, processors: Make) -> None:
    fake = fake_sidecar(lambda b: (429, {}, b""))
    with pytest.raises(SidecarBusy) as caught:
        processors(fake.port).process(batch(1))
    assert caught.value.retry_after is None


def test_a_server_error_is_unavailable(fake_sidecar: Fake, processors: Make) -> None:
    fake = fake_sidecar(lambda b: (500, {}, b"Traceback (most recent call last): ..."))
    with pytest.raises(SidecarUnavailable, match=r"failed the request \(500\): Traceback") as c:
        processors(fake.port).process(batch(1))
    assert not isinstance(c.value, SidecarProtocolError | SidecarBusy)


@pytest.mark.parametrize("status", [400, 401, 415, 422, 204, 302])
def test_other_statuses_are_protocol_errors(
    fake_sidecar: Fake, processors: Make, status: int
) -> None:
    body = json.dumps({"error": {"type": "UnsupportedVersion", "message": "want 2"}}).encode()
    fake = fake_sidecar(lambda b: (status, {}, body if status != 204 else b""))
    p = processors(fake.port)
    match = rf"rejected the request to /v1/process \({status}\)"
    with pytest.raises(SidecarProtocolError, match=match):
        p.process(batch(2))
    assert p.stats.protocol_errors == 1


def test_another_protocol_version_is_a_protocol_error(fake_sidecar: Fake, processors: Make) -> None:
    def v2(b: dict[str, Any]) -> Answer:
        status, _, body = echo_values(b)
        return status, {"Offtake-Protocol": "2"}, body

    match = "Offtake-Protocol: 2; this worker speaks version 1"
    with pytest.raises(SidecarProtocolError, match=match):
        processors(fake_sidecar(v2).port).process(batch(1))


@pytest.mark.parametrize(
    "body, problem",
    [
        (b"<html>oops</html>", "not JSON"),
        (b"", "not JSON"),
        (b'{"result": []}', 'no "results" list'),
        (b"[1, 2]", 'no "results" list'),
        (b'{"results": {"orders/0/0": {}}}', 'no "results" list'),
    ],
)
def test_a_malformed_body_fails_every_record_naming_it(
    fake_sidecar: Fake, processors: Make, body: bytes, problem: str
) -> None:
    p = processors(fake_sidecar(lambda b: (200, {}, body)).port)

    outcomes = p.process(batch(3))

    for i, outcome in enumerate(outcomes):
        err = error_of(outcome)
        assert err.record_id == f"orders/0/{i}"
        assert err.error_type == "MalformedResponse"
        assert problem in str(err) and f"orders/0/{i}" in str(err)
        assert outcome.retriable  # charged, retried a bounded number of times, then the policy
    assert p.stats.malformed_responses == 1


def test_result_level_mistakes_fail_only_their_record(fake_sidecar: Fake, processors: Make) -> None:
    def sloppy(b: dict[str, Any]) -> Answer:
        ids = [r["id"] for r in b["records"]]
        return ok(
            [
                {"id": ids[0], "values": ["fine"]},
                # ids[1]: no result at all
                {"id": ids[2], "values": ["one"]},
                {"id": ids[2], "values": ["two"]},
                {"id": ids[3], "values": "not a list"},
                {"id": ids[4], "valuesBase64": ["not base64!"]},
                {"id": ids[5], "values": ["a"], "valuesBase64": ["YQ=="]},
                {"id": ids[6], "error": 42},
                {"id": ids[7], "error": {"type": "X", "message": "m"}, "retriable": "no"},
                {"id": "orders/0/999", "values": ["stray"]},  # ignored
                "not an object",  # ignored
                {"values": ["no id"]},  # ignored
                {"id": ids[8], "values": None},
            ]
        )

    outcomes = processors(fake_sidecar(sloppy).port).process(batch(9))

    assert outcomes[0].ok and outcomes[0].values == ["fine"]
    expected = {
        1: "no result for this record",
        2: "2 results for this record",
        3: '"values" must be a list, got str',
        4: '"valuesBase64" holds something that is not base64',
        5: 'either "values" or "valuesBase64", not both',
        6: '"error" must be an object',
        7: '"retriable" must be true or false',
    }
    for i, text in expected.items():
        err = error_of(outcomes[i])
        assert text in str(err), (i, str(err))
        assert f"orders/0/{i}" in str(err)
    assert outcomes[8].ok and outcomes[8].values == []  # null values: dropped


def test_error_results(fake_sidecar: Fake, processors: Make) -> None:
    def errors(b: dict[str, Any]) -> Answer:
        ids = [r["id"] for r in b["records"]]
        return ok(
            [
                {
                    "id": ids[0],
                    "error": {"type": "ValidationError", "message": "no customer"},
                    "retriable": False,
                },
                {"id": ids[1], "error": {"message": "flaky"}},
                {"id": ids[2], "error": "just a string"},
                {"id": ids[3], "values": ["fine"], "retriable": "ignored without an error"},
            ]
        )

    first, second, third, fourth = processors(fake_sidecar(errors).port).process(batch(4))

    err = error_of(first)
    assert (err.error_type, err.message) == ("ValidationError", "no customer")
    assert first.retriable is False
    assert str(err) == "ValidationError: no customer (record orders/0/0)"
    err = error_of(second)
    assert (err.error_type, err.message, second.retriable) == ("Error", "flaky", True)
    assert error_of(third).message == "just a string"
    assert fourth.ok and fourth.values == ["fine"]


def test_binary_values_and_tombstones(fake_sidecar: Fake, processors: Make) -> None:
    def binary(b: dict[str, Any]) -> Answer:
        return ok(
            [{"id": r["id"], "valuesBase64": ["AP8=", None], "values": None} for r in b["records"]]
        )

    [outcome] = processors(fake_sidecar(binary).port).process(batch(1))
    assert outcome.values == [b"\x00\xff", None]


def test_413_splits_the_batch_and_fails_only_the_record_too_large(
    fake_sidecar: Fake, processors: Make
) -> None:
    def small_only(b: dict[str, Any]) -> Answer:
        too_big = len(b["records"]) > 2 or any(r["value"].get("huge") for r in b["records"])
        return (413, {}, b"payload too large") if too_big else echo_values(b)

    fake = fake_sidecar(small_only)
    records = batch(7)
    records[5] = rec({"n": 5, "huge": True}, 5)

    outcomes = processors(fake.port).process(records)

    assert [o.values for i, o in enumerate(outcomes) if i != 5] == [
        [{"n": i}] for i in (0, 1, 2, 3, 4, 6)
    ]
    err = error_of(outcomes[5])
    assert err.error_type == "PayloadTooLarge" and outcomes[5].retriable is False
    assert err.record_id == "orders/0/5"


def test_records_that_are_not_json_fail_alone(fake_sidecar: Fake, processors: Make) -> None:
    fake = fake_sidecar(echo_values)
    records = [rec({"n": 0}, 0), rec({"x": math.nan}, 1), rec({"n": 2}, 2)]

    outcomes = processors(fake.port).process(records)

    assert outcomes[0].values == [{"n": 0}] and outcomes[2].values == [{"n": 2}]
    err = error_of(outcomes[1])
    assert err.error_type == "EncodeError" and outcomes[1].retriable is False
    assert [r["id"] for r in fake.batches[0]["records"]] == ["orders/0/0", "orders/0/2"]


def test_a_batch_of_only_unencodable_records_sends_nothing(
    fake_sidecar: Fake, processors: Make
) -> None:
    fake = fake_sidecar(echo_values)
    [outcome] = processors(fake.port).process([rec(math.inf)])
    assert error_of(outcome).error_type == "EncodeError"
    assert fake.batches == []


def test_an_empty_batch_sends_nothing(fake_sidecar: Fake, processors: Make) -> None:
    fake = fake_sidecar(echo_values)
    assert processors(fake.port).process([]) == []
    assert fake.requests == []


def test_a_value_of_the_wrong_type_for_the_format_fails_alone() -> None:
    with pytest.raises(TypeError, match="format bytes expects a bytes value"):
        record_to_wire(rec("text"), "bytes")
    with pytest.raises(TypeError, match="format string expects a str value"):
        record_to_wire(rec(b"raw"), "string")


def test_unknown_format_is_refused() -> None:
    from sidecar_helpers import spec

    with pytest.raises(ValueError, match="format must be one of json, string, bytes"):
        SidecarProcessor(spec(8080), "avro")


def test_health_advertising_other_versions_fails_at_once(
    fake_sidecar: Fake, processors: Make
) -> None:
    fake = fake_sidecar(echo_values)
    fake.health = (200, {}, b'{"protocols": [2, 3]}')
    p = processors(fake.port)
    began = time.monotonic()
    assert p.wait_ready(timeout=30) is False
    assert time.monotonic() - began < 2
    assert p.not_ready_reason is not None
    assert "speaks protocol version(s) 2, 3; this worker speaks version 1" in p.not_ready_reason


def test_health_that_is_not_200_keeps_waiting(fake_sidecar: Fake, processors: Make) -> None:
    fake = fake_sidecar(echo_values)
    fake.health = (503, {}, b"warming up")
    p = processors(fake.port)
    assert p.wait_ready(timeout=0.3) is False
    assert p.not_ready_reason is not None
    assert p.not_ready_reason.endswith("/healthz answered 503: warming up")
    fake.health = (200, {}, b"")  # any body will do
    assert p.wait_ready(timeout=5) is True
    assert p.not_ready_reason is None
    assert p.probe() is None


def test_a_sidecar_that_takes_part_of_each_batch_still_gets_through_it(
    fake_sidecar: Fake, processors: Make
) -> None:
    """Pushback after two requests every time: the retried batch must not start over, or the
    same first chunks would be processed forever."""
    requests = [0]

    def two_then_busy(b: dict[str, Any]) -> Answer:
        requests[0] += 1
        return (429, {}, b"") if requests[0] % 3 == 0 else echo_values(b)

    fake = fake_sidecar(two_then_busy)
    p = processors(fake.port, max_batch_records=2)
    records = batch(10)  # 5 requests' worth

    calls = 0
    while True:
        calls += 1
        assert calls <= 5, "no progress"
        try:
            outcomes = p.process(records)
            break
        except SidecarBusy:
            continue

    assert [o.values for o in outcomes] == [[{"n": i}] for i in range(10)]
    sent = [r["id"] for b in fake.batches for r in b["records"]]
    answered = [r["id"] for i, b in enumerate(fake.batches) if (i + 1) % 3 for r in b["records"]]
    assert sorted(answered) == sorted(f"orders/0/{i}" for i in range(10))  # each answered once
    assert len(sent) == 10 + 2 * (calls - 1)  # only the refused chunks were sent twice
    assert p.stats.reused_results > 0


def test_kept_answers_serve_one_retry_only(fake_sidecar: Fake, processors: Make) -> None:
    fail = [False]

    def flaky(b: dict[str, Any]) -> Answer:
        return (503, {}, b"") if fail[0] else echo_values(b)

    fake = fake_sidecar(flaky)
    p = processors(fake.port, max_batch_records=1)
    first, second = rec({"v": "old"}, 0), rec({"v": "x"}, 1)

    def fail_after_first(b: dict[str, Any]) -> Answer:
        fail[0] = b["records"][0]["id"] == "orders/0/1"
        return flaky(b)

    fake.script = fail_after_first
    with pytest.raises(SidecarBusy):
        p.process([first, second])
    fake.script = flaky
    fail[0] = False
    p.process([second])  # a retry that no longer holds the first record
    assert p.process([rec({"v": "new"}, 0)])[0].values == [{"v": "new"}]  # answered afresh
