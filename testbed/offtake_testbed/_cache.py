"""Where the testbed keeps downloads and builds, and how installs report their progress."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from .process import file_lock


def cache_dir(*parts: str) -> Path:
    """Return (and create) a folder in the cache: ``$OFFTAKE_CACHE`` or ~/.cache/offtake."""
    root = Path(os.environ.get("OFFTAKE_CACHE", Path.home() / ".cache" / "offtake"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_lock(name: str) -> contextlib.AbstractContextManager[None]:
    """An exclusive inter-process lock named ``name`` in the cache, so that parallel test runs
    do not build the same thing twice."""
    return file_lock(cache_dir("locks") / f"{name}.lock")


# The file a finished install leaves in its folder, a JSON object: what was built (versions,
# the recipe, timings). A rerun that finds the versions and the recipe it would build returns
# at once; a bumped version or recipe builds again.
INSTALL_MARKER = ".installed.json"


def installed(
    folder: Path, expected: Mapping[str, object], *artefacts: Path
) -> dict[str, Any] | None:
    """The install marker of ``folder`` if it records a finished install of ``expected`` (each
    key with that value) and every one of ``artefacts`` exists; None otherwise (no marker, an
    unreadable one, another version or recipe, an artefact gone)."""
    try:
        marker = json.loads((folder / INSTALL_MARKER).read_text())
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(marker, dict) or any(marker.get(k) != v for k, v in expected.items()):
        return None
    return marker if all(artefact.exists() for artefact in artefacts) else None


def mark_installed(folder: Path, marker: Mapping[str, object]) -> None:
    """Record a finished install in ``folder`` (read back by :func:`installed`)."""
    (folder / INSTALL_MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def folder_size(path: Path) -> tuple[int, int]:
    """(number of files, bytes) under ``path``."""
    files = [p for p in path.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


class Progress:
    """Progress lines of one install, ``[offtake NAME] ...``, on a stream; silent without one.

    Installs take minutes on a cold machine: a person watching set-up should see what is being
    fetched or built, how far along it is, how long it took, and on a rerun that the cache
    answered. Tests call the installers without a stream and get no output.
    """

    def __init__(self, name: str, stream: IO[str] | None) -> None:
        self.name = name
        self.stream = stream

    def say(self, message: str) -> None:
        if self.stream is not None:
            print(f"[offtake {self.name}] {message}", file=self.stream, flush=True)

    def cached(self, what: str, where: object) -> None:
        self.say(f"found {what} in the cache: {where}")

    @contextlib.contextmanager
    def timed(self, what: str) -> Iterator[None]:
        """Say ``what ...`` now and ``what: done in N s`` when the block ends without error."""
        started = time.monotonic()
        self.say(f"{what} ...")
        yield
        self.say(f"{what}: done in {time.monotonic() - started:.1f} s")
