"""``python -m offtake_testbed.apicurio``: see :mod:`offtake_testbed.apicurio.cli`."""

import sys

from .cli import main

sys.exit(main())
