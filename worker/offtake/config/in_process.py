"""What runs in the worker's own process against what runs in pool processes.

``processor.concurrency`` > 1 and ``processor.lifespan`` run (or open) in the worker's process;
``parallelism`` > 1, ``timeoutSeconds`` and ``maxMemoryMiB`` run the function in pool processes
of its own (processing/parallel.py). A manifest that asks for both is refused, naming both
fields: which one to drop is the user's call.
"""

from __future__ import annotations

from offtake.config._fields import ConfigError, Fields

# Why concurrency cannot have each pool setting.
_CONCURRENCY = {
    "parallelism": "set one of them above 1, not both (concurrency waits on services in one "
    "process, parallelism runs CPU-bound code in several)",
    "timeoutSeconds": "a call on a thread or the event loop cannot be killed; bound the wait in "
    "the function (asyncio.timeout, the client's own timeout)",
    "maxMemoryMiB": "recycling needs pool processes, concurrency runs calls in the worker's "
    "process",
}
_LIFESPAN = (
    "the lifespan is entered once in the worker's process, and these run the function in pool "
    "processes of their own"
)


def check_lifespan(f: Fields, lifespan: str | None, function: str | None) -> None:
    """processor.lifespan names a module:callable, and goes with a function."""
    if lifespan is None:
        return
    if ":" not in lifespan or lifespan.startswith(":"):
        raise ConfigError(f.at("lifespan"), f"expected module:callable, got {lifespan!r}")
    if function is None:
        raise ConfigError(f.at("lifespan"), "applies to processor.function, which is not set")


def refuse_pool_clashes(
    f: Fields,
    *,
    concurrency: int,
    lifespan: str | None,
    parallelism: int,
    timeout: float | None,
    memory: int | None,
) -> None:
    """Refuse an in-process setting together with a pool one, naming both."""
    pool = {
        "parallelism": parallelism > 1,
        "timeoutSeconds": timeout is not None,
        "maxMemoryMiB": memory is not None,
    }
    for key, present in pool.items():
        if not present:
            continue
        if concurrency > 1:
            raise ConfigError(f.at("concurrency"), f"and {f.at(key)}: {_CONCURRENCY[key]}")
        if lifespan is not None:
            raise ConfigError(f.at("lifespan"), f"and {f.at(key)}: {_LIFESPAN}")
