"""A test-bed server for the length of a fixture: started, or the test fails saying why."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

import pytest


class Server(Protocol):
    def start(self) -> Any: ...
    def stop(self) -> Any: ...


S = TypeVar("S", bound=Server)


@contextmanager
def started(server: S, *errors: type[Exception]) -> Iterator[S]:
    """``server`` started (a start failing with one of ``errors`` fails the test, naming the
    cause, without a traceback), stopped afterwards."""
    try:
        server.start()
    except errors as exc:
        pytest.fail(f"the test bed could not start {type(server).__name__}: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()
