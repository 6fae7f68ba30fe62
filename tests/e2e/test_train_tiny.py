"""`relax train` end to end on a tiny random model (real hf engine, torch backend, reward
workers): every estimator runs 2 steps from its recipe; bad input fails before any model
loads; the final model loads with transformers."""

from __future__ import annotations

import json
import math
import re

import pytest
from conftest import ROOT, run_train, tiny_args
from train_helpers import ESTIMATORS

from relax_core.host.plugins import default_registry
from relax_core.reporting.metrics import read_metrics


@pytest.mark.parametrize("name", ESTIMATORS)
def test_every_estimator_runs_two_steps_from_its_recipe(name, tiny_model_dir, prompts_file, tmp_path):
    if name not in default_registry().names("estimator"):
        pytest.skip(f"estimator {name} not installed")
    recipe = ROOT / "examples" / "recipes" / f"{name}.yaml"
    code, out = run_train(["--config", str(recipe), *tiny_args(tiny_model_dir, prompts_file, tmp_path), "--no-save-hf"])
    assert code == 0, out
    recs = read_metrics(tmp_path / "run")
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        assert math.isfinite(r["train/loss"]) and math.isfinite(r["train/grad_norm"]), r
        assert r["train/skipped_steps"] == 0.0
        assert r["rollout/num_samples"] == 8.0 and 1 <= r["rollout/response_len/mean"] <= 8
    if name == "ppo":
        assert "train/value_loss" in recs[0]


def test_run_directory_and_final_model(tiny_model_dir, prompts_file, tmp_path):
    from transformers import AutoModelForCausalLM

    held_out = tmp_path / "eval" / "prompts.jsonl"  # two of the eight training prompts
    held_out.parent.mkdir()
    held_out.write_text("".join(prompts_file.read_text().splitlines(keepends=True)[:2]))
    code, out = run_train(tiny_args(tiny_model_dir, prompts_file, tmp_path, "--eval-data", str(held_out),
                                    "--eval-interval", "2", "--eval-max-prompts", "2", "--use-kl-loss",
                                    "--kl-loss-coef", "0.01", "--kl-loss-type", "low_var_kl"))
    assert code == 0, out
    run = tmp_path / "run"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["model"] == str(tiny_model_dir) and cfg["kl_loss_type"] == "low_var_kl"
    info = json.loads((run / "run_info.json").read_text())
    assert "relax-grpo" in info["plugins"] and info["old_log_probs"] == "detach(current)"
    assert info["train_data"] == {"name": "prompts", "rows": 6, "skipped_rows": 0, "eval_prompt_rows_left_out": 2}
    assert "2 of 8 training rows left out: their prompt is an evaluation prompt" in out
    recs = read_metrics(run)
    assert [r["step"] for r in recs] == [0, 1, 2]  # step 0 = evaluation before training
    assert "eval/prompts/pass@1" in recs[0] and "eval/prompts/reward_mean" in recs[-1]
    assert recs[1]["train/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # first step: π_θ = π_ref
    assert recs[2]["train/kl_loss"] > 0.0
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert {"prompt", "response", "reward", "label"} <= set(samples[0])
    model = AutoModelForCausalLM.from_pretrained(run / "final")
    assert model.config.num_hidden_layers == 2
    # what the screen shows (--quiet: plain lines): the phases, one line per step, the summary,
    # and no library progress bars
    assert "loading the model" in out and "[relax] step 2/2 | " in out
    assert "relax: done: 2 of 2 steps in " in out and re.search(r"held-out prompts +pass@1 ", out)
    assert re.search(rf"final model +{re.escape(str(run / 'final'))}", out) and f"relax plot {run}" in out
    assert "Loading weights" not in out and "Writing model shards" not in out


def test_bad_data_line_fails_before_any_model_loads(tiny_model_dir, tmp_path, monkeypatch):
    import relax_core.models as models

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the data was checked")

    monkeypatch.setattr(models, "load_model", boom)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "label": "1"}\n{"prompt": "b", "label": \n')
    code, out = run_train(tiny_args(tiny_model_dir, bad, tmp_path))
    assert code == 2
    assert f"{bad}:2: invalid JSON" in out
    nolabel = tmp_path / "nolabel.jsonl"
    nolabel.write_text('{"prompt": "a", "answer": "1"}\n')
    code, out = run_train(tiny_args(tiny_model_dir, nolabel, tmp_path))
    assert code == 2 and "no label key 'label'" in out
