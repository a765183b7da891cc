"""Transforms the Spark sink tests name by module:callable."""

from __future__ import annotations

from typing import Any


def double_amount(df: Any) -> Any:
    return df.withColumn("amount", df["amount"] * 2)


def broken(df: Any) -> Any:
    raise ValueError("bad column: no such field 'nope'")
