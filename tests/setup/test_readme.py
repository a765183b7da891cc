"""The README's snippets run exactly as printed, with no PYTHONPATH pointing into examples/."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def env_without_examples() -> dict[str, str]:
    """This environment, less any PYTHONPATH entry into examples/: the package must be installed."""
    env = dict(os.environ)
    kept = [
        entry
        for entry in env.get("PYTHONPATH", "").split(os.pathsep)
        if entry and Path(entry).resolve() != (ROOT / "examples").resolve()
    ]
    env["PYTHONPATH"] = os.pathsep.join(kept)
    return env


def test_the_process_snippet_runs_as_printed_with_the_installed_examples() -> None:
    [snippet] = [b for b in python_blocks() if "offtake_examples.enrich:handle" in b]
    done = subprocess.run(
        [sys.executable, "-c", snippet],
        env=env_without_examples(),
        cwd=Path.home(),  # not the repository: nothing importable by accident of the folder
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_validate_finds_the_example_function_from_any_folder() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "offtake.cli",
            "validate",
            str(ROOT / "examples/kafka-to-kafka.yaml"),
        ],
        env=env_without_examples(),
        cwd=Path.home(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
