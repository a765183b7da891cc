"""Tests on a real node (kubelet + containerd + runc, :mod:`offtake_testbed.node`) running the
worker image. They need the image (scripts/build-image.sh --target worker) and a one-time build
of the node's binaries (gcc and libseccomp-dev for runc), so they run only when asked for::

    OFFTAKE_NODE_TESTS=1 pytest -p no:cacheprovider -q tests/node

Without the variable they are reported as skipped with that command.
"""

from __future__ import annotations

import os

import pytest

OPT_IN = "OFFTAKE_NODE_TESTS"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(OPT_IN) == "1":
        return
    skip = pytest.mark.skip(
        reason=f"runs a real kubelet: {OPT_IN}=1 pytest -p no:cacheprovider -q tests/node"
    )
    for item in items:
        if "tests/node/" in str(item.fspath):
            item.add_marker(skip)
