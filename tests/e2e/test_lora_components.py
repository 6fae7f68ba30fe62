"""Every estimator, correction and environment trains with LoRA (issue: "contract runs once
with LoRA on the tiny model"): each runs one step of `relax train` with a rank-4 adapter on the
tiny model (hf engine, torch backend).  A run that ends at exit 0 has passed the
adapter-reached-the-engine check after its push (docs/guide/lora.md); the step must have
trained (finite loss, a non-zero, finite gradient norm, no skipped step).  Two steps of
GRPO with LoRA, resume and the broken push are tests/e2e/test_lora_run.py."""

from __future__ import annotations

import math

import pytest
from conftest import ROOT, run_train, tiny_args
from train_helpers import ESTIMATORS

from relax_core.reporting.metrics import read_metrics

LORA = ("--lora-rank", "4", "--lora-alpha", "8", "--no-save-hf", "--num-rollout", "1")
CASES = [pytest.param(("--config", str(ROOT / "examples" / "recipes" / f"{e}.yaml")), id=e) for e in ESTIMATORS] + [
    pytest.param(("--correction", "tis"), id="tis"),
    pytest.param(("--correction", "icepop"), id="icepop"),
    pytest.param(("--correction", "score_centering", "--advantage-estimator", "rloo",
                  "--calculate-per-token-loss"), id="score_centering"),
    pytest.param(("--environment", "retry", "--max-turns", "2"), id="retry"),
    pytest.param(("--environment", "tools", "--max-turns", "2"), id="tools"),
    pytest.param(("--correction", "routing_replay"), id="routing_replay"),  # on the tiny MoE model
]


@pytest.mark.parametrize("extra", CASES)
def test_trains_with_an_adapter(extra, request, prompts_file, tmp_path):
    model = request.getfixturevalue("tiny_moe_model_dir" if "routing_replay" in extra else "tiny_model_dir")
    code, out = run_train([*tiny_args(model, prompts_file, tmp_path), *extra, *LORA])
    assert code == 0, out
    assert "LoRA: the engine holds the adapted weights (step 1" in out
    recs = read_metrics(tmp_path / "run")
    assert [r["step"] for r in recs] == [1]
    r = recs[0]
    assert math.isfinite(r["train/loss"]) and r["train/skipped_steps"] == 0.0, r
    assert math.isfinite(r["train/grad_norm"]) and r["train/grad_norm"] > 0, r
