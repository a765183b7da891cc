"""Where the testbed keeps downloads and builds."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """Return (and create) a folder in the cache: ``$OFFTAKE_CACHE`` or ~/.cache/offtake."""
    root = Path(os.environ.get("OFFTAKE_CACHE", Path.home() / ".cache" / "offtake"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
