"""Fixtures of the fault-injection suite: a tiny prompt file (``train_helpers``); helpers in ``fault_helpers``,
scorers (importable by the reward worker processes) in ``fault_scorers``."""

from __future__ import annotations

import sys
from pathlib import Path

FAULTS = Path(__file__).resolve().parent
for path in (FAULTS, FAULTS.parent):  # appended: tests/e2e's `from conftest import ...` must still find its own
    if str(path) not in sys.path:
        sys.path.append(str(path))

from train_helpers import prompts_file  # noqa: E402,F401  (fixture)
