"""Waiting on a condition, the one way tests wait: never on a sleep or a fixed window."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from offtake_testbed.kube import KubectlError

T = TypeVar("T")


def wait_for(
    check: Callable[[], T | None],
    *,
    timeout: float = 60.0,
    what: str = "",
    explain: Callable[[], str] | None = None,
) -> T:
    """Poll until ``check`` returns something truthy; fail naming what was awaited, and with
    ``explain()`` (the state worth seeing: a timeline, log tails) when given."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
            last = result
        except (KeyError, IndexError, AssertionError, KubectlError) as exc:
            last = exc
        time.sleep(0.3)
    detail = f"\n{explain()}" if explain is not None else ""
    pytest.fail(f"timed out after {timeout:g}s waiting for {what or check}; last: {last!r}{detail}")
