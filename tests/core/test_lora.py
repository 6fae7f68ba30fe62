"""LoRA options at startup (every problem listed, the backend capability) and the
adapter-reached-the-engine decision on hand-made log-probs (relax_core.run.lora)."""

import json
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from relax_core.batch import Batch
from relax_core.config import RunConfig
from relax_core.contracts import ForwardOutput, GenerationOutput
from relax_core.run.lora import AdapterCheck, AdapterNotReached, lora_problems

runner = CliRunner()


def test_a_backend_without_lora_is_refused_with_every_other_lora_problem(tmp_path):
    r = runner.invoke(app, ["train", "--dry-run", "--train-backend", "megatron", "--lora-rank", "8",
                            "--lora-target-modules", "lm_head", "--ref-load", str(tmp_path), "--lora-dropout", "1"])
    assert r.exit_code == 2
    out = r.output
    assert "backend 'megatron' (relax-megatron " in out and "[supports_lora]: megatron cannot train LoRA adapters, " \
        "but --lora-rank is 8" in out and "fix: use --train-backend torch for LoRA, or --lora-rank 0" in out
    assert "[--ref-load]: with --lora-rank the reference model is the base model" in out
    assert "[--lora-dropout]: --lora-dropout 1.0 drops every adapter input" in out
    assert runner.invoke(app, ["train", "--dry-run", "--lora-rank", "8"]).exit_code == 0  # torch: valid


def test_lora_options_without_a_rank_are_refused():
    [(flag, msg, _)] = lora_problems(RunConfig(lora_alpha=32.0, save_hf_merged=True))
    assert flag == "--lora-rank" and msg.startswith("--lora-alpha, --save-hf-merged set without --lora-rank")
    assert lora_problems(RunConfig()) == []
    [(flag, _, _)] = lora_problems(RunConfig(lora_rank=4, launcher="ray", fully_async=True))
    assert flag == "--fully-async"


def test_the_backend_declares_what_it_can_adapt(tmp_path):
    """The torch backend's capability rows: an architecture without a default needs modules,
    the embeddings cannot carry an adapter (both listed in one refusal)."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    r = runner.invoke(app, ["train", "--dry-run", "--model", str(tmp_path), "--lora-rank", "4"])
    assert r.exit_code == 2
    assert "[lora_default_targets]: torch has no default --lora-target-modules for model type 'gpt2' (defaults " \
        "exist for llama, qwen2, qwen3, qwen3_moe)" in r.output and "fix: name the linear layers to adapt" in r.output
    r = runner.invoke(app, ["train", "--dry-run", "--model", str(tmp_path), "--lora-rank", "4",
                            "--lora-target-modules", "c_attn", "--lora-target-modules", "lm_head"])
    assert r.exit_code == 2 and "lora_default_targets" not in r.output
    assert "[lora_excluded_modules]: torch cannot put an adapter on lm_head" in r.output
    r = runner.invoke(app, ["train", "--dry-run", "--model", str(tmp_path), "--lora-rank", "4",
                            "--lora-target-modules", "c_attn"])
    assert r.exit_code == 0, r.output


class FakeEngine:
    """Returns two sampled tokens per prompt with log-probs ``e`` (the second of prompt 1 masked)."""

    def __init__(self, e):
        self.e, self.calls = torch.tensor(e), []

    def generate(self, prompt_ids, sampling):
        self.calls.append((prompt_ids, sampling))
        b = len(prompt_ids)
        return GenerationOutput(response_ids=torch.ones(b, 2, dtype=torch.long),
                                loss_mask=torch.tensor([[True, True], [True, False]]), rollout_log_probs=self.e)


class FakeBackend:
    def __init__(self, a, b):
        self.lp = {"actor": torch.tensor(a), "ref": torch.tensor(b)}

    def forward(self, batch, *, role):
        assert batch.size == 2
        return ForwardOutput(log_probs=self.lp[role])


def _check(e, a, b):
    cfg = SimpleNamespace(rollout_temperature=0.0, rollout_max_response_len=64, seed=3, rollout_engine="fake")
    notes = []
    engine = FakeEngine(e)
    return AdapterCheck(engine, FakeBackend(a, b), cfg, notes.append), engine, notes


# two prompts in three samples (groups 1, 1, 0): the probe takes each group's first sample
BATCH = Batch(prompt_ids=[[2, 3], [2, 3], [1]], group_index=torch.tensor([1, 1, 0]))
A = [[-1.0, -2.0], [-1.5, 99.0]]  # trainer, adapter on (99: masked, never read)
B = [[-1.3, -2.3], [-1.2, -99.0]]  # trainer, adapter off: |a − b| = 0.3 on each valid token


def test_an_engine_holding_the_adapted_weights_passes_once():
    check, engine, notes = _check([[-1.01, -2.0], [-1.5, 0.0]], A, B)
    assert check.probe(BATCH, 1) == pytest.approx((0.3, 0.01 / 3, (0.29 + 0.3 + 0.3) / 3))
    check(BATCH, 1)
    assert check.passed and notes and "engine holds the adapted weights" in notes[0]
    prompts, sampling = engine.calls[-1]
    assert prompts == [[2, 3], [1]] and sampling.temperature == 1.0 and sampling.top_p == 1.0
    assert sampling.seed == 3 + 7919 and sampling.max_new_tokens == 16
    check(BATCH, 2)
    assert len(engine.calls) == 2  # once passed, no more probes


def test_an_engine_still_holding_the_base_model_stops_the_run():
    check, _, _ = _check([[-1.3, -2.31], [-1.2, 5.0]], A, B)
    with pytest.raises(AdapterNotReached, match="did not reach the rollout engine 'fake'.*step 4"):
        check(BATCH, 4)


def test_an_adapter_that_has_not_moved_beyond_the_mismatch_is_checked_again():
    # the engine is 0.4 off the adapted model (bf16-like noise): the adapter's 0.3 < 2 × 0.4 cannot be told apart
    check, engine, notes = _check([[-0.6, -1.6], [-1.1, 0.0]], A, B)
    moved, d_on, d_off = check.probe(BATCH, 1)
    assert (moved, d_on, d_off) == pytest.approx((0.3, 0.4, (0.7 + 0.7 + 0.1) / 3))
    check(BATCH, 1)
    assert not check.passed and not notes and len(engine.calls) == 2
    check, _, _ = _check(A, A, A)  # nothing moved at all (B = 0 still): inconclusive, not a failure
    check(BATCH, 1)
    assert not check.passed


def test_relax_eval_of_a_lora_run_takes_final_merged_and_refuses_adapters(tmp_path):
    from cli.eval import resolve_target
    from relax_core.config import config_to_dict
    from relax_core.run.launch import BadInput

    run = tmp_path / "run"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "run_info.json").write_text("{}")
    (run / "config.json").write_text(json.dumps(config_to_dict(RunConfig(lora_rank=4)), default=str))
    (run / "checkpoints" / "step_000002" / "trainer_state.json").write_text("{}")
    with pytest.raises(BadInput, match="is a LoRA run: its final/ holds the adapter"):
        resolve_target(str(run), None, {})
    with pytest.raises(BadInput, match="a LoRA checkpoint holds the adapter only"):
        resolve_target(str(run), "2", {})
    (run / "final" / "merged").mkdir(parents=True)
    (run / "final" / "merged" / "config.json").write_text("{}")
    target = resolve_target(str(run), None, {})
    assert target.model == str(run / "final" / "merged") and target.weights is None
