"""Learning: GRPO raises the mean reward of the default model within a few minutes.

Task: the embedded SmolLM2-135M-Instruct answers the default reasoning-gym prompts and is
rewarded for brevity (``relax_e2e_scorers.brevity``: 1 − characters/120, floored at 0).  At
temperature 1 its answers range from a few characters to rambling past the 24-token limit,
so groups carry signal from the first step, and the policy can follow it by ending sooner.
(A tiny random model does not learn within minutes: its next-token distribution is nearly
uniform over 49k tokens, so no reward that depends on the text moves in a few steps.)

Margin: with ``k`` steps per quarter and σ the standard deviation of the per-step mean
reward over the first quarter, the difference of two quarter means has a standard error of
about σ·sqrt(2/k) when nothing is learned.  We require the last quarter to beat the first by
more than 4 such standard errors and by at least 0.05 absolute, so a pass is not noise (a
4-σ event has probability below 1e-4 under the null).
"""

from __future__ import annotations

import math
import statistics

import pytest
from conftest import run_train

from relax_core.metrics import read_metrics

STEPS = 16


@pytest.mark.slow
def test_grpo_raises_reward_on_the_default_model(tmp_path):
    code, out = run_train(["--output-dir", str(tmp_path), "--run-name", "run", "--num-rollout", str(STEPS),
                           "--rollout-batch-size", "2", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "24",
                           "--rollout-temperature", "1.0", "--lr", "5e-5", "--seed", "11", "--quiet", "--no-save-hf",
                           "--reward-num-workers", "1", "--custom-rm-path", "relax_e2e_scorers:brevity"])
    assert code == 0, out
    r = [m["rollout/raw_reward"] for m in read_metrics(tmp_path / "run")]
    k = STEPS // 4
    first, last = r[:k], r[-k:]
    se = statistics.stdev(first) * math.sqrt(2 / k)
    gain = statistics.fmean(last) - statistics.fmean(first)
    assert gain > max(0.05, 4 * se), f"first quarter {first}, last quarter {last}, gain {gain:.3f}, 4·se {4 * se:.3f}"
