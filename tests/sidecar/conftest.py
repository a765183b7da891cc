"""Fixtures for the sidecar tests; the helpers they use are in sidecar_helpers.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sidecar_helpers import FakeSidecar, References, Script, spec

from offtake.processing.sidecar import SidecarProcessor


@pytest.fixture(params=["python", "go"])
def references(request: pytest.FixtureRequest) -> Iterator[References]:
    """Starts reference processors (Python, then Go) and stops them after the test."""
    refs = References(request.param)
    yield refs
    refs.stop_all()


@pytest.fixture
def python_references() -> Iterator[References]:
    refs = References("python")
    yield refs
    refs.stop_all()


@pytest.fixture
def processors() -> Iterator[Callable[..., SidecarProcessor]]:
    """Makes SidecarProcessors for a port and closes them after the test."""
    made: list[SidecarProcessor] = []

    def make(port: int, fmt: str = "json", **kw: Any) -> SidecarProcessor:
        p = SidecarProcessor(spec(port, **kw), fmt)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


@pytest.fixture
def fake_sidecar() -> Iterator[Callable[[Script], FakeSidecar]]:
    """Makes scriptable sidecars (see FakeSidecar) and stops them after the test."""
    made: list[FakeSidecar] = []

    def make(script: Script) -> FakeSidecar:
        fake = FakeSidecar(script)
        made.append(fake)
        return fake

    yield make
    for fake in made:
        fake.close()
