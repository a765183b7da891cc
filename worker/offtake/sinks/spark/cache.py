"""Where the Spark sink caches what it fetches or makes once (resolved packages, class-data
archives). A leaf: the session and the class-data archive both use it."""

from __future__ import annotations

from pathlib import Path

from offtake import environment


def cache_root() -> Path:
    """Where the worker caches what it fetches or makes once: ``$OFFTAKE_CACHE``, else
    ~/.cache/offtake."""
    return environment.cache_root()


def ivy_settings() -> Path:
    """The Ivy settings every package set is resolved with (``spark.jars.ivySettings``): Maven
    Central only, no fallback to repos.spark-packages.org (see the file's comment)."""
    return Path(__file__).with_name("ivysettings.xml")


def ivy_dir() -> Path:
    """Ivy's cache for resolved packages: ``$OFFTAKE_CACHE/ivy`` or ~/.cache/offtake/ivy."""
    path = cache_root() / "ivy"
    path.mkdir(parents=True, exist_ok=True)
    return path
