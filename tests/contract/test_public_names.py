"""The names users import: ``offtake`` and ``offtake.testing`` re-export them from the modules
that make them, and the examples import nothing else of Offtake."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = ("offtake", "offtake.testing")
EXAMPLE_SOURCES = sorted((ROOT / "examples").rglob("*.py"))


@pytest.mark.parametrize("name", PUBLIC)
def test_each_public_name_is_the_internal_object_itself(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__all__
    for attr in module.__all__:
        value = getattr(module, attr)
        # Re-exported, not redefined: the object comes from the module that makes it.
        assert value.__module__ != name, f"{name}.{attr} is defined in the facade"


def _offtake_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m == "offtake" or m.startswith("offtake.")}


def test_the_examples_import_only_the_public_modules() -> None:
    assert EXAMPLE_SOURCES
    for path in EXAMPLE_SOURCES:
        extra = _offtake_imports(path) - set(PUBLIC)
        assert not extra, f"{path.relative_to(ROOT)} imports {sorted(extra)}"
