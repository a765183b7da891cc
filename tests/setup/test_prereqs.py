"""scripts/prereqs.sh, the check set-up runs before any long step, on a PATH lacking a tool."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASH = shutil.which("bash") or "/bin/bash"


def check(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(path), "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(
        [BASH, str(ROOT / "scripts" / "prereqs.sh"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def tools_except(tmp_path: Path, *left_out: str) -> Path:
    """A PATH folder with this machine's python, java, mvn and go, except ``left_out``."""
    folder = tmp_path / "bin"
    folder.mkdir()
    real = {
        # The interpreter itself, not a venv's or pyenv's wrapper around it.
        "python3": os.path.realpath(sys.executable),
        "java": shutil.which("java"),
        "mvn": shutil.which("mvn"),
        "go": shutil.which("go"),
    }
    for name, target in real.items():
        if name not in left_out and target is not None:
            (folder / name).symlink_to(os.path.realpath(target))
    return folder


def test_a_missing_tool_is_named_with_its_install_command_and_the_check_fails(
    tmp_path: Path,
) -> None:
    done = check(tools_except(tmp_path, "mvn"))
    assert done.returncode == 1
    missing = [line for line in done.stderr.splitlines() if line.startswith("missing: ")]
    assert len(missing) == 1, done.stderr
    assert missing[0].startswith("missing: mvn (Maven 3.6+")
    assert "apt-get install -y maven" in missing[0]
    assert "stopped before installing anything" in done.stderr


@pytest.mark.parametrize("mode", ["--all", "--tests"])  # --tests: scripts/test.sh's set-up
def test_every_missing_tool_gets_its_own_line(tmp_path: Path, mode: str) -> None:
    done = check(tools_except(tmp_path, "java", "mvn", "python3", "go"), mode)
    assert done.returncode == 1
    missing = [line for line in done.stderr.splitlines() if line.startswith("missing: ")]
    named = [line.removeprefix("missing: ").split(" ")[0] for line in missing]
    assert named[:4] == ["python", "java", "mvn", "go"], done.stderr
    assert "openjdk-17-jre-headless" in missing[1]


def test_with_everything_there_it_names_what_it_found(tmp_path: Path) -> None:
    if shutil.which("java") is None or shutil.which("mvn") is None:
        raise AssertionError("the test machine needs java and mvn (scripts/setup.sh checks)")
    done = check(tools_except(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("prerequisites found: python 3.")
    assert "java " in done.stdout and "mvn" in done.stdout


def test_the_node_tier_names_runcs_build_tools_among_the_debian_packages(tmp_path: Path) -> None:
    # The PATH holds no gcc and no pkg-config (nor prometheus, nor apt-get): all are named.
    done = check(tools_except(tmp_path), "--node")
    assert done.returncode == 1
    missing = [line for line in done.stderr.splitlines() if line.startswith("missing: ")]
    assert len(missing) == 1, done.stderr
    assert "gcc pkg-config" in missing[0] and "prometheus" in missing[0], missing
    assert "(what the tests run or build with)" in missing[0]
