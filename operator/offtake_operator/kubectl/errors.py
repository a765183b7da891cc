"""The errors the plugin reports as one line a person can act on, with their exit codes.

2 is argparse's (a command line it cannot read), so the plugin's own start at 3.
"""

from __future__ import annotations

from ..errors import OperatorError


class PluginError(OperatorError):
    """A failure worth one line on stderr and a non-zero exit; never a traceback."""

    exit_code = 1


class NoClusterError(PluginError):
    exit_code = 3


class NoCrdError(PluginError):
    exit_code = 4


class NotFoundError(PluginError):
    exit_code = 5


class KafkaUnreachableError(PluginError):
    exit_code = 6


class TimedOutError(PluginError):
    exit_code = 7
