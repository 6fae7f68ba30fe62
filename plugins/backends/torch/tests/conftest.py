import sys
from pathlib import Path

from relax_core.testing.fixtures import tiny_model_dir, tiny_moe_model_dir  # noqa: F401  (until the kit's pytest plugin registers them)

sys.path.insert(0, str(Path(__file__).parent))  # relax_torch_test_helpers (tests import with --import-mode=importlib)
