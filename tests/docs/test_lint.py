"""The tree passes ruff's checks configured in pyproject.toml ([tool.ruff]: pyflakes, syntax
errors, import order), so an unused import or an unsorted import block fails the suite."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_check_passes():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is not installed (it is in the test extra: make install)"
    done = subprocess.run([ruff, "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, f"ruff check found problems (fix with 'ruff check --fix .'):\n{done.stdout}{done.stderr}"
