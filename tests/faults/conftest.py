import sys
from pathlib import Path

# The exact decoders of the ops tests (tests/ops/reference.py) serve here too.
sys.path.insert(0, str(Path(__file__).parents[1] / "ops"))
