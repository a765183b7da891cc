"""The root of every error the operator package raises: ``except OperatorError`` catches them all.

The operator's counterpart of the worker's :class:`offtake.OfftakeError` (a separate root: the
operator imports the worker through ``offtake.contract`` only, and an error of one program is
never the other's to catch). Each exception class of ``offtake_operator`` derives from
:class:`OperatorError` and keeps the builtin base it had (``class SettingsError(OperatorError,
ValueError)``), so no ``except ValueError`` or ``except RuntimeError`` changes meaning.

The kubectl plugin's :class:`~offtake_operator.kubectl.errors.PluginError` is under it too: the
plugin is part of this package (it uses the operator's names, lag and Secret mapping, and
raises their errors), and keeps PluginError as its own sub-root for its one-line messages and
exit codes. No class derives from kopf's ``TemporaryError`` or ``PermanentError``: the handlers
raise kopf's own where they mean one (kopf retries any other exception after its backoff), so
a class here needs no second, kopf base.

A module at the bottom of the operator's layers: it imports nothing. tests/operator/
test_operator_errors.py walks every exception class defined in the package and holds this rule.
"""

from __future__ import annotations


class OperatorError(Exception):
    """Base class of the operator package's exceptions (see the module docstring)."""
