"""A scorer that raises for one sample, one that hangs, and a reward worker killed
mid-batch: the step's other samples keep their rewards, the failure is counted, and the
unscored sample is NaN (no learning signal, as docs/guide/rewards.md says), not a reward of
0 — `rollout/raw_reward` is the mean of the scored samples only."""

from __future__ import annotations

import json
import math

import pytest
from fault_helpers import run_train, tiny_args
from fault_scorers import vowel_fraction

from relax_core.reporting.metrics import read_metrics
from relax_core.stages import rewarding


@pytest.mark.parametrize("scorer, counted", [
    ("raises", "rollout/reward_errors"),
    ("kills_its_worker", "rollout/reward_errors"),
    ("hangs", "rollout/reward_timeouts"),
])
def test_one_failing_sample_leaves_the_others_scored(scorer, counted, tiny_model_dir, prompts_file, tmp_path,
                                                      monkeypatch):
    rewarding.shutdown_pools()  # fresh workers, which read the environment below
    monkeypatch.setenv("RELAX_FAULT_AT", "3")
    monkeypatch.setenv("RELAX_FAULT_DIR", str(tmp_path))
    code, out = run_train(tiny_args(tiny_model_dir, prompts_file, tmp_path, "--custom-rm-path",
                                    f"fault_scorers:{scorer}", "--reward-timeout", "2"))
    rewarding.shutdown_pools()
    assert code == 0, out
    first, second = read_metrics(tmp_path / "run")
    assert first[counted] == 1.0 and second[counted] == 0.0
    assert first["rollout/reward_errors"] + first["rollout/reward_timeouts"] == 1.0
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    step1 = [s for s in samples if s["step"] == 1]
    assert len(step1) == 8
    unscored = [s for s in step1 if s["reward"] == "nan"]
    assert len(unscored) == 1 and step1.index(unscored[0]) == 2  # the third sample of the run
    scored = [s for s in step1 if s["reward"] != "nan"]
    for s in scored:
        assert s["reward"] == pytest.approx(vowel_fraction(s["response"], None, None))
    assert first["rollout/raw_reward"] == pytest.approx(sum(s["reward"] for s in scored) / 7)
    assert math.isfinite(first["train/loss"]) and first["train/skipped_steps"] == 0.0
