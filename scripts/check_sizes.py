"""The house's size rules (issue 40): no function over 80 lines, no module over 600.

A long function or module holds more than one idea; the rule keeps new ones from growing. The
files that broke it when the rule came are named in ``scripts/size_allowlist.txt`` with their
size then: an entry may only shrink (it fails when the file grows past it, and when the file
comes within the rule, so the entry is deleted). Lines are counted as Python's ast spans them:
a function from its ``def`` (decorators included) to its last line, docstring and comments in.

::

    python scripts/check_sizes.py [folders...]    # scripts/lint.sh runs it on worker operator
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWLIST = ROOT / "scripts" / "size_allowlist.txt"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600
FOLDERS = ("worker", "operator")


def sizes(path: Path) -> Iterator[tuple[str, int, int]]:
    """(name, size, limit) of the module and of each of its functions, methods included."""
    text = path.read_text()
    yield "<module>", len(text.splitlines()), MAX_MODULE_LINES
    tree = ast.parse(text, filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            last = node.end_lineno or node.lineno
            yield f"{_qualname(tree, node)}", last - first + 1, MAX_FUNCTION_LINES


def _qualname(tree: ast.Module, target: ast.AST) -> str:
    def walk(node: ast.AST, prefix: str) -> str | None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if child is target:
                    return name
                found = walk(child, f"{name}.")
                if found:
                    return found
        return None

    return walk(tree, "") or "?"


def read_allowlist(path: Path = ALLOWLIST) -> dict[tuple[str, str], int]:
    """``path name size`` per line; ``#`` starts a comment."""
    allowed = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        entry = line.split("#", 1)[0].split()
        if not entry:
            continue
        if len(entry) != 3 or not entry[2].isdigit():
            raise SystemExit(f"{path}:{number}: expected 'path name size', got {line!r}")
        allowed[(entry[0], entry[1])] = int(entry[2])
    return allowed


def check(folders: list[str], allowed: dict[tuple[str, str], int], root: Path = ROOT) -> list[str]:
    """What breaks the rules in ``folders`` (below ``root``), given the allowlist."""
    problems = []
    seen = set()
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            if ".venv" in path.parts or "node_modules" in path.parts:
                continue
            rel = path.relative_to(root).as_posix()
            for name, size, limit in sizes(path):
                key = (rel, name)
                what = "module" if name == "<module>" else f"function {name}"
                if key in allowed:
                    seen.add(key)
                    if size > allowed[key]:
                        problems.append(
                            f"{rel}: {what} grew to {size} lines, past its allowlisted "
                            f"{allowed[key]} (the limit is {limit}): shrink it"
                        )
                    elif size <= limit:
                        problems.append(
                            f"{rel}: {what} is {size} lines, within the limit of {limit}: "
                            f"delete its entry from {ALLOWLIST.relative_to(ROOT)}"
                        )
                elif size > limit:
                    problems.append(f"{rel}: {what} is {size} lines, over the limit of {limit}")
    for key in sorted(set(allowed) - seen):
        if any(key[0].startswith(f"{f}/") for f in folders):
            problems.append(
                f"{key[0]}: {key[1]} is gone: delete its entry from {ALLOWLIST.relative_to(ROOT)}"
            )
    return problems


def main(argv: list[str]) -> int:
    problems = check(argv or list(FOLDERS), read_allowlist())
    for problem in problems:
        print(f"size: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
