"""Issue 6 acceptance: a scorer that raises for every sample, and one that sleeps past
--reward-timeout, leave a 2-step `relax train` run finishing with the failures counted."""

from __future__ import annotations

import time

import pytest
from conftest import run_train, tiny_args

from relax_core.reporting.metrics import read_metrics


@pytest.mark.parametrize("scorer, counted, other", [
    ("always_raise", "rollout/reward_errors", "rollout/reward_timeouts"),
    pytest.param("sleep_past_timeout", "rollout/reward_timeouts", "rollout/reward_errors",
                 marks=pytest.mark.slow),  # ~35 s here: each timed-out worker is killed and respawned
])
def test_failing_scorer_leaves_a_two_step_run_finishing(scorer, counted, other, tiny_model_dir, prompts_file, tmp_path):
    t0 = time.monotonic()
    code, out = run_train(tiny_args(tiny_model_dir, prompts_file, tmp_path, "--custom-rm-path",
                                    f"reward_failure_scorers:{scorer}", "--reward-timeout", "1",
                                    "--reward-num-workers", "2", "--no-save-hf"))
    assert code == 0, out
    recs = read_metrics(tmp_path / "run")
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:  # every one of the 2 × 4 samples of each step failed, and was counted
        assert r[counted] == 8.0 and r[other] == 0.0, r
    # the sleeper is stopped at the timeout: 2 steps × 4 rounds of 1 s on 2 workers, not an hour
    assert time.monotonic() - t0 < 300
