"""Every rendered child equals its golden byte for byte (see render_goldens.py for the inputs
and the command that regenerates the goldens after a change that is meant)."""

from __future__ import annotations

import pytest
from render_goldens import GOLDENS, cases

CASES = dict(cases())


def test_every_golden_has_a_case_and_every_case_a_golden() -> None:
    assert sorted(p.name for p in GOLDENS.glob("*.yaml")) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_children_equal_the_golden(name: str) -> None:
    assert CASES[name] == (GOLDENS / name).read_text()
