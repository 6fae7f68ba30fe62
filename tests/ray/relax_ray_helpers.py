"""Helpers of the Ray tests: `relax train` flags for short runs on the tiny model, an
in-process runner, and the trained-prompt log reader."""

from __future__ import annotations

import json
from pathlib import Path


def ray_args(model: Path, data: Path, out: Path, name: str, *extra: str) -> list[str]:
    """`relax train --launcher ray` flags: 2 prompts × 4 samples, 8 new tokens, 4 steps."""
    return ["--model", str(model), "--data", str(data), "--output-dir", str(out), "--run-name", name,
            "--custom-rm-path", "relax_ray_scorers:vowel_fraction", "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "4", "--global-batch-size", "8", "--rollout-max-response-len", "8",
            "--num-rollout", "4", "--quiet", "--lr", "1e-2", "--seed", "3", "--reward-num-workers", "1",
            "--no-save-hf", "--launcher", "ray", *extra]


def run_train(args: list[str]) -> tuple[int, str]:
    """Run `relax train ARGS` in this process; returns (exit code, output)."""
    from typer.testing import CliRunner

    from cli.main import app

    res = CliRunner().invoke(app, ["train", *args])
    if res.exception and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, res.output


def trained(run: Path) -> list[dict]:
    """The run's `trained_prompts.jsonl` records."""
    return [json.loads(x) for x in (run / "trained_prompts.jsonl").read_text().splitlines()]
