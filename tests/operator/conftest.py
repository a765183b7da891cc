import sys
from pathlib import Path

# The test helpers sit beside the tests; make them importable as a plain module.
sys.path.insert(0, str(Path(__file__).parent))
