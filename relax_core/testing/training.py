"""A 2-step run of the real loop on a tiny random model, for plugin tests."""

from __future__ import annotations

import json
from pathlib import Path


def train_tiny(tmp_path: Path, *args: str, moe: bool = False) -> list[dict]:
    """Run ``relax train`` for 2 steps (hf engine, torch backend) on a tiny random Qwen3
    (or Qwen3-MoE with ``moe=True``) written under ``tmp_path``, with extra CLI ``args``.

    Returns the two ``train/*`` metric rows of ``metrics.jsonl``.

    Raises:
        AssertionError: the run did not exit 0 (its output is in the message) or did not
            log two training steps.
    """
    from typer.testing import CliRunner

    from cli.main import app
    from relax_core.models import make_tiny_model

    model = make_tiny_model(tmp_path / "model", moe=moe)
    res = CliRunner().invoke(app, [
        "train", "--model", str(model), "--num-rollout", "2", "--rollout-batch-size", "2",
        "--n-samples-per-prompt", "2", "--rollout-max-response-len", "6", "--output-dir", str(tmp_path / "runs"),
        "--run-name", "r", "--quiet", "--wandb-mode", "disabled", "--no-save-hf",
        "--save-debug-rollout-data", str(tmp_path / "rollouts"), *args])
    assert res.exit_code == 0, res.output
    lines = (tmp_path / "runs" / "r" / "metrics.jsonl").read_text().splitlines()
    steps = [m for m in map(json.loads, lines) if "train/loss" in m]
    assert len(steps) == 2
    return steps
