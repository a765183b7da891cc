"""``python -m offtake_testbed.kafka``: see :mod:`offtake_testbed.kafka.cli`."""

import sys

from .cli import main

sys.exit(main())
