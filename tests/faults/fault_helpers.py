"""Helpers of the fault-injection suite: `relax train` flags for the tiny model, a runner in
this process and one as a real subprocess in its own process group."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import train_helpers
from train_helpers import run_train  # noqa: F401  (the suite's runner)

FAULTS = Path(__file__).resolve().parent
ROOT = FAULTS.parents[1]
#: Metrics that must agree between an interrupted-and-resumed run and an uninterrupted one.
COMPARED = ("rollout/raw_reward", "rollout/response_len/mean", "train/loss", "train/pg_loss", "train/grad_norm",
            "train/entropy")


def tiny_args(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    """`relax train` flags (:func:`train_helpers.tiny_args`): the fault scorers, ``--lr 1e-2``,
    every sample logged, no final model."""
    return train_helpers.tiny_args(model, data, out, "--log-samples-per-step", "8", "--no-save-hf", *extra,
                                   scorer="fault_scorers:vowel_fraction", lr="1e-2")


def relax_subprocess(args: list[str], env: dict[str, str] | None = None,
                     timeout: float = 600) -> subprocess.CompletedProcess:
    """`relax train ARGS` as a real subprocess leading its own process group (a terminal's
    foreground job: a SIGINT sent to its group reaches it and every worker it started)."""
    full = dict(os.environ, **(env or {}))
    full["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(FAULTS), full.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "cli.main", "train", *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=timeout, start_new_session=True)


def assert_same_metrics(a: list[dict], b: list[dict]) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b):
        for k in COMPARED:
            assert x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-6), (x["step"], k, x[k], y[k])
