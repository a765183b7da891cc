"""scripts/test.sh on a bare machine: the control plane builds in the background
(``scripts/setup.sh --tests``) while the tests that do not need it run.

With ``$OFFTAKE_KUBE_BUILDING`` set, offtake_testbed.pytest_plugin_kube hands out the files that
need the control plane last and lets their timeouts cover the test alone (the fixture waits for
the build); without it, nothing changes. Checked on an inner pytest run, as xdist's processes
would collect.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from offtake_testbed.kube import control_plane_installed, wait_for_build
from offtake_testbed.kube.install import background_build_log

pytest_plugins = ["pytester"]

FILES = {
    # Named so that collection finds it first: only the plugin can move it last.
    "test_a_kube": """
import pytest

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(300)
def test_k(request):
    marker = request.node.get_closest_marker("timeout")
    print("TIMEOUT", marker.args, marker.kwargs)
""",
    "test_b_plain": """
def test_p(request):
    print("TIMEOUT", request.node.get_closest_marker("timeout"))
""",
}


def _run(pytester: pytest.Pytester) -> pytest.RunResult:
    pytester.makepyfile(**FILES)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest(
        "-p", "offtake_testbed.pytest_plugin_kube", "-p", "no:cacheprovider", "-v", "-s"
    )
    result.assert_outcomes(passed=2)
    return result


def _order(result: pytest.RunResult) -> list[str]:
    return [line.split("::")[0] for line in result.outlines if "::test_" in line]


def test_a_background_build_sends_the_control_plane_files_last_timed_without_the_fixture(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OFFTAKE_KUBE_BUILDING", "/nowhere/background-build.log")
    result = _run(pytester)
    assert _order(result) == ["test_b_plain.py", "test_a_kube.py"]
    # The test's own timeout is kept; only the fixture's wait for the build is outside it.
    assert "TIMEOUT (300,) {'func_only': True}" in result.stdout.str()
    assert "TIMEOUT None" in result.stdout.str()  # a test without the control plane: untouched


def test_without_a_background_build_the_order_and_timeouts_are_the_files_own(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OFFTAKE_KUBE_BUILDING", raising=False)
    result = _run(pytester)
    assert _order(result) == ["test_a_kube.py", "test_b_plain.py"]
    assert "TIMEOUT (300,) {}" in result.stdout.str()


def test_waiting_for_a_build_no_process_runs_returns_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OFFTAKE_CACHE", str(tmp_path))
    wait_for_build("v1.34.4")  # the lock is free: returns
    assert not control_plane_installed("v1.34.4")  # an empty cache holds no control plane


def test_built_says_where_the_background_build_logs_when_it_is_not_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m offtake_testbed.kube built`` is where scripts/setup.sh --tests and
    scripts/test.sh read the background build's log path from: one spelling of it."""
    monkeypatch.setenv("OFFTAKE_CACHE", str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "offtake_testbed.kube", "built"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done
    assert done.stdout.strip() == str(tmp_path / "kube" / "background-build.log")
    assert Path(done.stdout.strip()) == background_build_log()
