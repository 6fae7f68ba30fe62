"""Fixtures of the fault-injection suite: a tiny prompt file; helpers in ``fault_helpers``,
scorers (importable by the reward worker processes) in ``fault_scorers``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

FAULTS = Path(__file__).resolve().parent
if str(FAULTS) not in sys.path:  # appended: tests/e2e's `from conftest import ...` must still find its own
    sys.path.append(str(FAULTS))


@pytest.fixture(scope="session")
def prompts_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("fault-data") / "prompts.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"What is {i} + {i + 1}?", "label": str(2 * i + 1)}) + "\n"
                         for i in range(8)))
    return p
