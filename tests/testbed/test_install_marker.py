"""offtake_testbed._cache's install marker: the one check every cached build (the control plane,
helm, the node, prometheus-adapter, the spark-operator, the scanners) makes before building."""

from __future__ import annotations

import json
from pathlib import Path

from offtake_testbed._cache import INSTALL_MARKER, installed, mark_installed


def test_a_marked_install_is_found_with_its_versions_and_artefacts(tmp_path: Path) -> None:
    binary = tmp_path / "tool"
    binary.write_text("#!/bin/sh\n")
    mark_installed(tmp_path, {"recipe": 2, "version": "v1.0", "build_seconds": 3.5})
    found = installed(tmp_path, {"recipe": 2, "version": "v1.0"}, binary)
    assert found == {"recipe": 2, "version": "v1.0", "build_seconds": 3.5}


def test_anything_else_builds_again(tmp_path: Path) -> None:
    binary = tmp_path / "tool"
    expected = {"recipe": 2, "version": "v1.0"}
    assert installed(tmp_path, expected) is None  # no marker
    mark_installed(tmp_path, {"recipe": 1, "version": "v1.0"})
    assert installed(tmp_path, expected) is None  # an older recipe
    mark_installed(tmp_path, {"recipe": 2, "version": "v0.9"})
    assert installed(tmp_path, expected) is None  # another version
    mark_installed(tmp_path, {"recipe": 2})
    assert installed(tmp_path, expected) is None  # a key missing
    mark_installed(tmp_path, expected)
    assert installed(tmp_path, expected, binary) is None  # the artefact gone
    for text in ("{not json", "[1, 2]", ""):  # cut short by a killed build, or not an object
        (tmp_path / INSTALL_MARKER).write_text(text)
        assert installed(tmp_path, expected) is None, text
    (tmp_path / INSTALL_MARKER).write_text(json.dumps(expected))
    assert installed(tmp_path, expected) == expected
