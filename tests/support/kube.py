"""Small helpers for tests against the real control plane (kubectl through the testbed)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from offtake_testbed.kube import KubectlError
from offtake_testbed.pytest_plugin_kube import Kubectl

T = TypeVar("T")


def wait_for(check: Callable[[], T | None], *, timeout: float = 60.0, what: str = "") -> T:
    """Poll until ``check`` returns something truthy; fail naming what was awaited."""
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
    pytest.fail(f"timed out after {timeout:g}s waiting for {what or check}; last: {last!r}")


def get(kubectl: Kubectl, *args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


def exists(kubectl: Kubectl, *args: str) -> bool:
    return (
        kubectl("get", *args, "--ignore-not-found", "-o", "name", check=False).stdout.strip() != ""
    )
