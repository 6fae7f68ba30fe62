"""Helpers of the fault-injection suite: `relax train` flags for the tiny model, a runner in
this process and one as a real subprocess in its own process group."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FAULTS = Path(__file__).resolve().parent
ROOT = FAULTS.parents[1]
#: Metrics that must agree between an interrupted-and-resumed run and an uninterrupted one.
COMPARED = ("rollout/raw_reward", "rollout/response_len/mean", "train/loss", "train/pg_loss", "train/grad_norm",
            "train/entropy")


def tiny_args(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    """`relax train` flags: tiny model, 2 prompts × 4 samples, 8 new tokens, one reward worker
    (so that a scorer counting its calls counts every sample of the run, in order)."""
    return ["--model", str(model), "--data", str(data), "--output-dir", str(out), "--run-name", "run",
            "--custom-rm-path", "fault_scorers:vowel_fraction", "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "4", "--global-batch-size", "8", "--rollout-max-response-len", "8",
            "--num-rollout", "2", "--quiet", "--lr", "1e-2", "--seed", "3", "--reward-num-workers", "1",
            "--log-samples-per-step", "8", "--no-save-hf", *extra]


def run_train(args: list[str]) -> tuple[int, str]:
    """`relax train ARGS` in this process: (exit code, output)."""
    from typer.testing import CliRunner

    from cli.main import app

    res = CliRunner().invoke(app, ["train", *args])
    if res.exception and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, res.output


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
