"""A 2-step run of the real loop on a tiny random model, for plugin tests."""

from __future__ import annotations

import json
from pathlib import Path


def train_tiny(tmp_path: Path, *args: str, moe: bool = False) -> list[dict]:
    """Run the loop of ``relax train`` (:func:`relax_core.run.launch.configure`, then
    :func:`~relax_core.run.launch.launch`) for 2 steps (hf engine, torch backend) on a tiny random Qwen3
    (or Qwen3-MoE with ``moe=True``) written under ``tmp_path``, with extra CLI ``args``.

    Returns the two ``train/*`` metric rows of ``metrics.jsonl``.

    Raises:
        relax_core.run.launch.BadInput: the flags are refused.
        AssertionError: the run did not exit 0 or did not
            log two training steps.
    """
    from relax_authoring.testing.models import make_tiny_model
    from relax_core.host.plugins import default_registry
    from relax_core.run.launch import configure, launch

    model = make_tiny_model(tmp_path / "model", moe=moe)
    reg = default_registry()
    cfg, resolved, _ = configure([
        "--model", str(model), "--num-rollout", "2", "--rollout-batch-size", "2",
        "--n-samples-per-prompt", "2", "--rollout-max-response-len", "6", "--output-dir", str(tmp_path / "runs"),
        "--run-name", "r", "--quiet", "--wandb-mode", "disabled", "--no-save-hf",
        "--save-debug-rollout-data", str(tmp_path / "rollouts"), *args], reg)
    code = launch(cfg, resolved, reg)
    assert code == 0, f"relax train exited {code} (its output is in the captured stdout/stderr)"
    lines = (tmp_path / "runs" / "r" / "metrics.jsonl").read_text().splitlines()
    steps = [m for m in map(json.loads, lines) if "train/loss" in m]
    assert len(steps) == 2
    return steps
