"""The worker reads its environment in offtake/environment.py and cli.py only (issue 40: the
environment read at the edges), and the variables keep the meaning users set them with."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from offtake import environment
from offtake.kafka.config import secret_properties
from offtake.sinks.spark.cache import cache_root

PACKAGE = Path(environment.__file__).parent
EDGES = {PACKAGE / "environment.py", PACKAGE / "cli.py"}


def reads_of_the_environment(path: Path) -> list[int]:
    """Lines of ``path`` that touch ``os.environ`` or call ``os.getenv``/``os.putenv``."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("environ", "getenv", "putenv", "environb")
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ) or (
            isinstance(node, ast.ImportFrom)
            and node.module == "os"
            and any(a.name in ("environ", "getenv", "putenv") for a in node.names)
        ):
            lines.append(node.lineno)
    return lines


def test_no_module_but_the_edges_reads_the_environment() -> None:
    found = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in EDGES and (lines := reads_of_the_environment(path))
    }
    assert found == {}, f"read the environment in offtake/environment.py instead: {found}"
    # The check sees what it looks for: both edges do read it.
    assert all(reads_of_the_environment(path) for path in EDGES)


def test_a_blank_variable_is_unset_and_a_folder_falls_back_to_its_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(environment.KAFKA_SECRET_DIR_ENV, "  ")
    assert environment.value(environment.KAFKA_SECRET_DIR_ENV) is None
    assert environment.directory(environment.KAFKA_SECRET_DIR_ENV, "/etc/x") == Path("/etc/x")
    # A caller's own folder wins over the variable and the default; None or "" is no folder.
    monkeypatch.setenv(environment.KAFKA_SECRET_DIR_ENV, "/from/env")
    assert environment.directory(environment.KAFKA_SECRET_DIR_ENV, "/etc/x", "/mine") == Path(
        "/mine"
    )
    assert environment.directory(environment.KAFKA_SECRET_DIR_ENV, "/etc/x", "") == Path(
        "/from/env"
    )
    assert environment.directory(environment.KAFKA_SECRET_DIR_ENV, "/etc/x", None) == Path(
        "/from/env"
    )
    # The documented variable still points the worker at a mounted Secret's folder.
    (tmp_path / "sasl.password").write_text("s3cret\n")
    monkeypatch.setenv(environment.KAFKA_SECRET_DIR_ENV, str(tmp_path))
    assert secret_properties() == {"sasl.password": "s3cret"}
    monkeypatch.setenv(environment.CACHE_ENV, str(tmp_path / "cache"))
    assert cache_root() == tmp_path / "cache"
    monkeypatch.delenv(environment.CACHE_ENV)
    assert cache_root() == Path.home() / ".cache" / "offtake"
