"""Shared helpers of the end-to-end tests: a tiny prompt file, `relax train` flags and a runner
(:mod:`train_helpers`)."""

from __future__ import annotations

import sys
from pathlib import Path

E2E = Path(__file__).resolve().parent
ROOT = E2E.parents[1]
if str(E2E) not in sys.path:
    sys.path.insert(0, str(E2E))
if str(E2E.parent) not in sys.path:  # train_helpers
    sys.path.append(str(E2E.parent))

import train_helpers  # noqa: E402
from train_helpers import prompts_file, run_train  # noqa: E402,F401  (fixture; the suite's runner)


def tiny_args(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    """`relax train` flags for a 2-step run on a tiny model (:func:`train_helpers.tiny_args`)."""
    return train_helpers.tiny_args(model, data, out, *extra, scorer="relax_e2e_scorers:vowel_fraction", lr="1e-3")
