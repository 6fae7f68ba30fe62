"""`relax train` with the embedded SmolLM2-135M-Instruct and the default reasoning-gym task:
2 steps of a small batch (slow: a real 135M model on CPU)."""

from __future__ import annotations

import math

import pytest
from conftest import run_train

from relax_core.reporting.metrics import read_metrics


@pytest.mark.slow
def test_two_steps_on_smollm2_with_the_default_task(tmp_path):
    code, out = run_train(["--output-dir", str(tmp_path), "--run-name", "run", "--num-rollout", "2",
                           "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "16",
                           "--quiet", "--no-save-hf", "--reward-num-workers", "1", "--eval-data", "none"])
    assert code == 0, out
    recs = read_metrics(tmp_path / "run")
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        assert math.isfinite(r["train/loss"]) and r["train/skipped_steps"] == 0.0
        assert 0.0 <= r["rollout/raw_reward"] <= 1.0
        assert r["rollout/reward_errors"] == 0.0
