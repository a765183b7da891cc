"""Transforms the Spark sink tests name by module:callable."""

from __future__ import annotations

import os
from typing import Any


def double_amount(df: Any) -> Any:
    return df.withColumn("amount", df["amount"] * 2)


def broken(df: Any) -> Any:
    raise ValueError("bad column: no such field 'nope'")


def broken_counted(df: Any) -> Any:
    """Fails every attempt, noting each call in $OFFTAKE_TEST_ATTEMPTS_FILE (one line per
    attempt), so a test can count the sink's retries from outside the worker process."""
    counter = os.environ.get("OFFTAKE_TEST_ATTEMPTS_FILE")
    if counter:
        with open(counter, "a") as f:
            f.write("attempt\n")
    raise ValueError("bad column: no such field 'nope'")
