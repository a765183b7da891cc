"""The root of every error Offtake raises: ``except offtake.OfftakeError`` catches them all.

Each of Offtake's exception classes derives from :class:`OfftakeError`, and keeps the builtin
base it had before (``class ConfigError(OfftakeError, ValueError)``) so that no ``except
ValueError`` or ``except ConnectionError`` anywhere changes meaning. A module at the bottom of
the worker's layers: every layer may import it, it imports nothing of Offtake's.

tests/unit/test_errors.py walks every exception class defined in the ``offtake`` package and
holds this rule; the few that stay outside are listed there with the reason.
"""

from __future__ import annotations


class OfftakeError(Exception):
    """Base class of Offtake's exceptions (see the module docstring)."""
