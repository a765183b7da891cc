"""configure_logging: JSON lines with pipeline and record location; the level is configurable."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from offtake.logs import ENV_LEVEL, configure_logging, record_fields
from offtake.records import Record


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_lines_carry_timestamp_level_logger_message_pipeline_and_location() -> None:
    out = io.StringIO()
    configure_logging("info", "orders-enrich", stream=out)
    record = Record("orders", 3, 42, b"k", {"a": 1}, (), 1_700_000_000_000, b"{}")
    logging.getLogger("offtake.engine").warning(
        "record %s failed", record.where(), extra={**record_fields(record), "attempts": 3}
    )
    logging.getLogger("offtake.engine").info("plain")
    first, second = lines(out)
    assert first["level"] == "WARNING" and first["logger"] == "offtake.engine"
    assert first["message"] == "record orders[3]@42 failed"
    assert first["pipeline"] == "orders-enrich"
    assert (first["topic"], first["partition"], first["offset"], first["attempts"]) == (
        "orders",
        3,
        42,
        3,
    )
    assert str(first["timestamp"]).endswith("+00:00")
    assert "topic" not in second and second["message"] == "plain"


def test_level_filters_and_comes_from_the_environment_when_not_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = io.StringIO()
    monkeypatch.setenv(ENV_LEVEL, "warning")
    configure_logging(None, "p", stream=out)
    log = logging.getLogger("x")
    log.info("hidden")
    log.warning("shown")
    assert [line["message"] for line in lines(out)] == ["shown"]
    configure_logging("DEBUG", "p", stream=out)  # the argument wins over the environment
    log.debug("debug now")
    assert lines(out)[-1]["message"] == "debug now"


def test_an_unknown_level_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"'loud'.*DEBUG, INFO"):
        configure_logging("loud", "p")
    monkeypatch.setenv(ENV_LEVEL, "chatty")
    with pytest.raises(ValueError, match=ENV_LEVEL):
        configure_logging(None, "p")


def test_reconfiguring_replaces_the_handler_and_keeps_exceptions() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", "p", stream=first)
    configure_logging("info", "p", stream=second)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("y").exception("failed", extra={"odd": object()})
    assert first.getvalue() == ""
    (line,) = lines(second)
    assert "RuntimeError: boom" in str(line["exception"]) and str(line["odd"]).startswith("<object")
