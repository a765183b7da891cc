"""Structured JSON logs: one object per line, on stderr.

Every line carries ``timestamp`` (UTC, RFC 3339), ``level``, ``logger``, ``message`` and
``pipeline``; fields passed with ``extra=`` (``topic``, ``partition``, ``offset``, or any other
JSON-able value) are added as they are::

    log.warning("record failed", extra={"topic": "orders", "partition": 3, "offset": 42})
    log.warning("record failed", extra=record_fields(record))

stderr, not stdout, because the ``log`` sink prints records on stdout: keeping the two apart
lets ``offtake worker ... > records.jsonl`` capture records only.

librdkafka's own log lines come through the same handler (every client gets
:func:`librdkafka_logger` as its ``logger`` property) instead of raw ``%3|...|FAIL|`` lines
on stderr. librdkafka repeats a failing connection's error every backoff (many times a
second against a closed port), so that logger lets the first of similar lines through and
then at most one per :data:`REPEAT_WINDOW_SECONDS`, saying how many it left out.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from datetime import UTC, datetime
from typing import IO, Any

from offtake.records import Record
from offtake.redact import redact

__all__ = [
    "ENV_LEVEL",
    "LIBRDKAFKA_LOGGER",
    "REPEAT_WINDOW_SECONDS",
    "JsonFormatter",
    "RepeatFilter",
    "configure_logging",
    "librdkafka_logger",
    "record_fields",
]

ENV_LEVEL = "OFFTAKE_LOG_LEVEL"
LIBRDKAFKA_LOGGER = "offtake.librdkafka"
REPEAT_WINDOW_SECONDS = 30.0
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)


class JsonFormatter(logging.Formatter):
    """Formats a LogRecord as one JSON object."""

    def __init__(self, pipeline: str) -> None:
        super().__init__()
        self.pipeline = pipeline

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            # Every line through redact(): a message may quote a URL or a driver's error
            # with a credential in it, whichever module logged it.
            "message": redact(record.getMessage()),
            "pipeline": self.pipeline,
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        if record.exc_info:
            out["exception"] = redact(self.formatException(record.exc_info))
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        # default=str: a stray non-JSON value in extra= must not lose the whole line.
        return json.dumps(out, default=str, ensure_ascii=False)


def _parse_level(level: str | None, origin: str) -> int:
    text = (level or "INFO").strip().upper()
    if text == "WARN":
        text = "WARNING"
    if text not in _LEVELS:
        raise ValueError(
            f"unknown log level {level!r} (from {origin}); expected one of {', '.join(_LEVELS)}"
        )
    return int(getattr(logging, text))


def configure_logging(
    level: str | None,
    pipeline: str,
    stream: IO[str] | None = None,
    origin: str = "the argument",
) -> logging.Handler:
    """Send all logging through one JSON handler on the root logger.

    ``level`` is a level name (case-insensitive); None or "" is INFO. ``origin`` names where
    the level came from, for the error on an unknown one (the CLI, which reads
    $OFFTAKE_LOG_LEVEL: :data:`ENV_LEVEL`, passes the option or the variable). Calling it again
    replaces the handler it installed before (not others'), so tests and the CLI can call it
    more than once. Returns the handler.
    """
    numeric = _parse_level(level, origin)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_offtake", False)]:
        root.removeHandler(old)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter(pipeline))
    handler._offtake = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(numeric)
    return handler


def record_fields(record: Record) -> dict[str, Any]:
    """``extra=`` fields that locate a record: topic, partition and offset."""
    return {"topic": record.topic, "partition": record.partition, "offset": record.offset}


# Numbers vary between otherwise identical librdkafka lines ("after 3ms", "2 identical
# error(s) suppressed", thread and client ids): lines equal but for numbers are "similar".
_NUMBERS = re.compile(r"\d+")


class RepeatFilter(logging.Filter):
    """Passes the first of similar lines, then at most one per window with the count left out.

    Similar: same level and the same message once digits are ignored. Thread-safe, because
    each client's logs are served on the thread that polls it.
    """

    _MAX_KEYS = 1000  # a bound on memory; forgetting a key only lets one more line through

    def __init__(self, window_seconds: float = REPEAT_WINDOW_SECONDS) -> None:
        super().__init__()
        self.window = window_seconds
        self._lock = threading.Lock()
        # key -> (when the last line passed, how many similar lines were left out since)
        self._seen: dict[str, tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        key = f"{record.levelno}:{_NUMBERS.sub('#', message)}"
        now = time.monotonic()
        with self._lock:
            passed, left_out = self._seen.get(key, (-self.window, 0))
            if now - passed < self.window:
                self._seen[key] = (passed, left_out + 1)
                return False
            if len(self._seen) >= self._MAX_KEYS:
                self._seen.clear()
            self._seen[key] = (now, 0)
        if left_out:
            record.msg = (
                f"{message} ({left_out} similar line(s) left out in the last {now - passed:.0f} s)"
            )
            record.args = ()
            record.repeated = left_out
        return True


_librdkafka_lock = threading.Lock()


def librdkafka_logger() -> logging.Logger:
    """The logger every Kafka client logs through (its ``logger`` property): JSON, de-repeated."""
    logger = logging.getLogger(LIBRDKAFKA_LOGGER)
    with _librdkafka_lock:
        if not any(isinstance(f, RepeatFilter) for f in logger.filters):
            logger.addFilter(RepeatFilter())
    return logger
