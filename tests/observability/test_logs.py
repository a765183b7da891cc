"""configure_logging: JSON lines with pipeline and record location; the level is configurable."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from offtake.cli import setup_logging
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
    setup_logging(None, "p", stream=out)  # the CLI reads the environment, offtake.logs does not
    log = logging.getLogger("x")
    log.info("hidden")
    log.warning("shown")
    assert [line["message"] for line in lines(out)] == ["shown"]
    setup_logging("DEBUG", "p", stream=out)  # the option wins over the environment
    log.debug("debug now")
    assert lines(out)[-1]["message"] == "debug now"


def test_an_unknown_level_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"'loud'.*DEBUG, INFO"):
        configure_logging("loud", "p")
    monkeypatch.setenv(ENV_LEVEL, "chatty")
    with pytest.raises(ValueError, match=ENV_LEVEL):
        setup_logging(None, "p")
    with pytest.raises(ValueError, match="--log-level"):
        setup_logging("loud", "p")


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


def test_librdkafka_lines_are_collapsed_per_window_and_say_how_many_were_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from offtake import logs

    out = io.StringIO()
    configure_logging("info", "p", stream=out)
    clock = [1000.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: clock[0])
    kafka = logging.getLogger("offtake.test-librdkafka")
    kafka.addFilter(logs.RepeatFilter(window_seconds=30.0))
    fail = "FAIL [rdkafka#consumer-%d]: Connect to ipv4#127.0.0.1:1 failed (after %dms)"
    for attempt in range(200):  # librdkafka's reconnect backoff: many failures a second
        kafka.error(fail, 1, attempt % 7)
        clock[0] += 0.1
    kafka.warning("another message")
    clock[0] += 15.0  # 35 s after the first line: the window is over
    kafka.error(fail, 1, 3)
    first, other, again = lines(out)
    assert (
        first["message"] == "FAIL [rdkafka#consumer-1]: Connect to ipv4#127.0.0.1:1 failed "
        "(after 0ms)"
    )
    assert other["message"] == "another message"
    assert again["message"].startswith("FAIL [rdkafka#consumer-1]")  # type: ignore[union-attr]
    assert "199 similar line(s) left out in the last 35 s" in str(again["message"])
    assert again["repeated"] == 199


def test_every_kafka_client_logs_through_the_collapsing_json_logger() -> None:
    from offtake.config import parse_pipeline
    from offtake.kafka.config import consumer_config, producer_config
    from offtake.logs import LIBRDKAFKA_LOGGER, RepeatFilter

    spec = parse_pipeline(
        {
            "apiVersion": "offtake.dev/v1alpha1",
            "kind": "ConsumerPipeline",
            "metadata": {"name": "p"},
            "spec": {
                "kafka": {"bootstrapServers": "k:9092"},
                "source": {"topics": ["a"]},
                "sink": {"log": {}},
            },
        }
    )
    for conf in (consumer_config(spec), producer_config(spec)):
        logger = conf["logger"]
        assert logger.name == LIBRDKAFKA_LOGGER
        assert [f for f in logger.filters if isinstance(f, RepeatFilter)]
