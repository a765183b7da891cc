"""What the plugin writes to a terminal: never a control character that came from data.

A producer's key, an error text, a log line, a condition's or an Event's message: any of them
may carry ESC sequences (a window title, a clear screen, an OSC 52 clipboard write), BEL, a
carriage return that hides what came before, C1 controls that some terminals read as ESC.
Every byte the plugin writes goes through :class:`Safe`, which writes each such character as
a visible escape (``\\x1b``, ``\\x07``, ``\\x9b``); only ``\\n`` passes, so lines keep their
layout. Renderers put data through :func:`one_line` as well, so a newline inside a value
cannot forge a line of the plugin's own (``\\n`` in a key is shown as ``\\x0a``). The plugin's
own sequences (the watch's clear screen) are written with :meth:`Safe.control`, the one way
past the escape.
"""

from __future__ import annotations

import re
from typing import Any, TextIO

# C0 controls but \n, DEL, and the C1 controls (U+0080..U+009F).
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")
_CONTROL_OR_NEWLINE = re.compile("[\x00-\x1f\x7f-\x9f]")


def _hex(found: re.Match[str]) -> str:
    return f"\\x{ord(found.group()):02x}"


def escape(text: str) -> str:
    """``text`` with every control character but ``\\n`` written as ``\\xNN``."""
    return _CONTROL.sub(_hex, text)


def one_line(value: Any) -> str:
    """A value from data as one line: every control character, ``\\n`` too, as ``\\xNN``."""
    return _CONTROL_OR_NEWLINE.sub(_hex, str(value))


class Safe:
    """A text stream (stdout, stderr) that escapes every control character written to it but
    ``\\n``: the one place the plugin's output goes through."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(escape(text))

    def control(self, sequence: str) -> None:
        """The plugin's own terminal sequence (a constant, never data), written as it is."""
        self._stream.write(sequence)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()
