"""``python -m offtake_operator.kubectl``: the plugin without the console script on PATH."""

import sys

from .cli import main

sys.exit(main(sys.argv[1:]))
