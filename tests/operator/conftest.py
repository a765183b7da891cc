import os
import sys
from pathlib import Path

# The test helpers sit beside the tests; make them importable as plain modules.
sys.path.insert(0, str(Path(__file__).parent))

# Read when offtake_operator.handlers is imported: a short tick keeps the tests (and the
# operator's shutdown, which waits for a sleeping timer) fast.
os.environ.setdefault("OFFTAKE_TICK_SECONDS", "0.2")
