"""The image tests build real OCI images (scripts/build-image.sh: buildah, no Docker engine),
which takes minutes: they run only when asked for,

    OFFTAKE_IMAGE_TESTS=1 pytest -p no:cacheprovider -q tests/image

(as root; `OFFTAKE_IMAGE_TARGETS="operator worker worker-spark"` adds the Spark image, several
minutes more). Without the variable they are reported as skipped with that command; the quick
static checks of the Dockerfile (test_dockerfile.py) always run.
"""

from __future__ import annotations

import os

import pytest

OPT_IN = "OFFTAKE_IMAGE_TESTS"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(OPT_IN) == "1":
        return
    skip = pytest.mark.skip(
        reason=f"builds images (minutes): {OPT_IN}=1 pytest -p no:cacheprovider -q tests/image"
    )
    for item in items:
        if item.get_closest_marker("image") is not None:
            item.add_marker(skip)
