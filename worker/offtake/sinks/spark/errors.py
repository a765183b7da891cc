"""Short, readable descriptions of what failed inside Spark.

A Py4J error's text is the whole Java stack trace, which makes logs and the DLQ's error
header unreadable; the exception chain's messages say what went wrong.
"""

from __future__ import annotations

from typing import Any

MAX_CHARS = 600


def describe(exc: BaseException) -> str:
    """``Type: message`` of the error and of up to two Java causes, on one line."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            return _clip(_java_chain(java))
        except Exception:  # the JVM may be gone; fall back to the Python text
            pass
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    name = type(exc).__name__
    return _clip(f"{name}: {first}" if first else name)


def _java_chain(java: Any) -> str:
    parts: list[str] = []
    seen = 0
    while java is not None and seen < 3:
        text = str(java.toString()).strip().splitlines()[0]
        if not parts or text not in parts[-1]:
            parts.append(text)
        java = java.getCause()
        seen += 1
    return " <- caused by ".join(parts)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 3] + "..."
