"""``python -m offtake_testbed.node``: see :mod:`offtake_testbed.node.cli`."""

import sys

from .cli import main

sys.exit(main())
