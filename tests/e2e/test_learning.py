"""Learning: GRPO on a tiny random model raises the mean reward within a couple of minutes.

Task: the reward is the fraction of vowels among the letters of the response
(``relax_e2e_scorers.vowel_fraction``), which a random policy scores at about 0.3 and which
the policy can raise by shifting mass to vowel-heavy tokens.

Margin: with ``k`` steps per quarter and σ the standard deviation of the per-step mean
reward over the first quarter, the difference of two quarter means has a standard error of
about σ·sqrt(2/k) under "no learning".  We require the last quarter to beat the first by
more than 4 such standard errors and by at least 0.05 absolute, so a pass is not noise
(a 4-σ event has probability < 1e-4 under the null).
"""

from __future__ import annotations

import math
import statistics

import pytest
from conftest import run_train, tiny_args

from relax_core.metrics import read_metrics

STEPS = 24


@pytest.mark.slow
def test_grpo_raises_reward_on_a_tiny_model(tiny_model_dir, prompts_file, tmp_path):
    code, out = run_train(tiny_args(tiny_model_dir, prompts_file, tmp_path, "--num-rollout", str(STEPS),
                                    "--n-samples-per-prompt", "8", "--global-batch-size", "16", "--lr", "3e-3",
                                    "--no-save-hf"))
    assert code == 0, out
    r = [m["rollout/raw_reward"] for m in read_metrics(tmp_path / "run")]
    k = STEPS // 4
    first, last = r[:k], r[-k:]
    se = statistics.stdev(first) * math.sqrt(2 / k)
    gain = statistics.fmean(last) - statistics.fmean(first)
    assert gain > max(0.05, 4 * se), f"first quarter {first}, last quarter {last}, gain {gain:.3f}, 4·se {4 * se:.3f}"
