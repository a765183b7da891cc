"""REPORT lines: the numbers a test measured, printed and appended to ``$OFFTAKE_REPORT``."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any


def report(name: str, **numbers: Any) -> None:
    line = json.dumps({"test": name, **numbers})
    print(f"\nREPORT {line}")
    target = os.environ.get("OFFTAKE_REPORT")
    if target:
        with open(target, "a") as f:
            f.write(line + "\n")


def lost_and_duplicated(expected: int, counts: Counter[int]) -> tuple[int, int]:
    """How many of ids 0..expected-1 never arrived, and how many arrived more than once."""
    lost = sum(1 for i in range(expected) if counts[i] == 0)
    duplicated = sum(c - 1 for c in counts.values() if c > 1)
    return lost, duplicated


def assert_each_once(name: str, expected: int, counts: Counter[int], **numbers: Any) -> None:
    """Report what ``name`` delivered of ids 0..expected-1 (with ``numbers``), then assert that
    every id arrived exactly once."""
    lost, duplicated = lost_and_duplicated(expected, counts)
    report(name, produced=expected, lost=lost, duplicated=duplicated, **numbers)
    assert (lost, duplicated) == (0, 0)
