import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # relax_torch_test_helpers (tests import with --import-mode=importlib)
