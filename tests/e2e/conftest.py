"""Shared helpers of the end-to-end tests: a tiny prompt file and a `relax train` runner."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

E2E = Path(__file__).resolve().parent
ROOT = E2E.parents[1]
if str(E2E) not in sys.path:
    sys.path.insert(0, str(E2E))


@pytest.fixture(scope="session")
def prompts_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"What is {i} + {i + 1}?", "label": str(2 * i + 1)}) + "\n"
                         for i in range(8)))
    return p


def tiny_args(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    """`relax train` flags for a 2-step run on a tiny model: 2 prompts × 4 samples, 8 new tokens."""
    return ["--model", str(model), "--data", str(data), "--output-dir", str(out), "--run-name", "run",
            "--custom-rm-path", "relax_e2e_scorers:vowel_fraction", "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "4", "--global-batch-size", "8", "--rollout-max-response-len", "8",
            "--num-rollout", "2", "--quiet", "--lr", "1e-3", "--seed", "3", "--reward-num-workers", "1", *extra]


def run_train(args: list[str]) -> tuple[int, str]:
    """Run `relax train ARGS` in this process; returns (exit code, output)."""
    from typer.testing import CliRunner

    from cli.main import app

    res = CliRunner().invoke(app, ["train", *args])
    if res.exception and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, res.output
