"""Strict readers of the values of Offtake's own headers (``offtake.*``).

Anyone who may produce to a source topic, a retry topic or a dead-letter topic can write any
header, so a header value is untrusted input: a partition must be a non-negative 32-bit int,
an offset or a count a non-negative 64-bit int written in ASCII digits (no sign, no spaces, no
Unicode digits such as ``"²"``, which ``str.isdigit()`` accepts and ``int()`` refuses), a topic
a valid Kafka topic name. A bad value raises :class:`HeaderError`, whose message names the
header and shows the value, so the caller can fail that one record and go on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from offtake.errors import OfftakeError

#: A header list as Kafka clients hand it over (confluent-kafka gives bytes; str tolerated).
HeaderList = Sequence[tuple[str, bytes | str | None]]

MAX_PARTITION = 2**31 - 1  # Kafka's partition is an int32
MAX_INT64 = 2**63 - 1  # offsets, timestamps, counts
# ASCII digits only, at most 19 of them (int64): bounded before int() ever sees it.
_DIGITS = re.compile(rb"[0-9]{1,19}")
# Kafka's own rule (org.apache.kafka.common.internals.Topic): these characters, 1 to 249.
_TOPIC = re.compile(rb"[A-Za-z0-9._-]{1,249}")
_SHOWN = 40  # bytes of a bad value quoted in an error: enough to recognise, never a flood


class HeaderError(OfftakeError, ValueError):
    """A header's value is not what Offtake writes there; the message names the header."""

    def __init__(self, name: str, raw: bytes, why: str) -> None:
        shown = raw[:_SHOWN] + (b"..." if len(raw) > _SHOWN else b"")
        super().__init__(f"header {name}: {why}, got {shown!r}")
        self.name = name


def _bytes(value: bytes | str) -> bytes:
    return value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value


def last(headers: HeaderList | None, name: str) -> bytes | None:
    """The last non-null value of header ``name``, as bytes, or None.

    The last, because Offtake appends its own headers after every header it carries over, and
    moves a producer's ``offtake.*`` headers aside (``dead_letters.dlq_headers``): should
    several copies ever reach a reader, the one written last is Offtake's.
    """
    found: bytes | None = None
    for key, value in headers or ():
        if key == name and value is not None:
            found = _bytes(value)
    return found


def read_int(headers: HeaderList | None, name: str, maximum: int = MAX_INT64) -> int | None:
    """Header ``name`` as an int in ``[0, maximum]``; None if absent or empty."""
    raw = last(headers, name)
    if raw is None or raw == b"":
        return None
    if not _DIGITS.fullmatch(raw):
        raise HeaderError(name, raw, "expected a non-negative integer in ASCII digits")
    value = int(raw)
    if value > maximum:
        raise HeaderError(name, raw, f"expected at most {maximum}")
    return value


def read_partition(headers: HeaderList | None, name: str) -> int | None:
    return read_int(headers, name, MAX_PARTITION)


def read_topic(headers: HeaderList | None, name: str) -> str | None:
    """Header ``name`` as a Kafka topic name; None if absent."""
    raw = last(headers, name)
    if raw is None:
        return None
    if not _TOPIC.fullmatch(raw) or raw in (b".", b".."):
        raise HeaderError(
            name, raw, "expected a Kafka topic name (1 to 249 of a-z, A-Z, 0-9, '.', '_', '-')"
        )
    return raw.decode("ascii")
