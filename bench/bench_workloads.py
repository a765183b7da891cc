"""The per-record work of bench/passthrough.py, written once and called by every contender.

Standard library only: the same file is imported by Offtake's worker (``processor.function``),
by the hand-written loop, and by Quix Streams and Arroyo in their own virtualenvs, so the
function logic is identical and only each contender's way of calling it differs.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

# Rounds of SHA-256 per record for the CPU-heavy workload: enough that the function, not Kafka,
# is the bottleneck (~0.1 ms per record on one core here), few enough to keep the run short.
HASH_ROUNDS = 200


def enrich(event: dict[str, Any]) -> dict[str, Any]:
    """The JSON workload: read fields of the record and change it."""
    event["customer"] = event["customer"].upper()
    event["amount_cents"] = round(event["amount"] * 100)
    event["large"] = event["amount"] > 1000
    return event


def enrich_bytes(value: bytes) -> bytes:
    """``enrich`` for contenders that see raw bytes: parse, change, serialise (compactly)."""
    return json.dumps(enrich(json.loads(value)), separators=(",", ":")).encode()


def burn(value: bytes) -> bytes:
    """The CPU-heavy workload: a fixed amount of hashing, its digest appended to the value."""
    digest = value
    for _ in range(HASH_ROUNDS):
        digest = hashlib.sha256(digest).digest()
    return value + b"|" + digest[:8].hex().encode()


# -- adapters for Offtake's processor.function (called with an offtake Record) ---------------
# Typed loosely on purpose: this module must import without the offtake package (the other
# contenders' virtualenvs do not have it).


def offtake_enrich(record: Any) -> dict[str, Any]:
    """Offtake decodes ``format: json`` itself and its Kafka sink encodes the dict returned."""
    return enrich(record.value)


def offtake_burn(record: Any) -> bytes:
    return burn(record.value)
