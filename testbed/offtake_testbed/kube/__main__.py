"""``python -m offtake_testbed.kube``: see :mod:`offtake_testbed.kube.cli`."""

import sys

from .cli import main

sys.exit(main())
