"""LoRA end to end on the tiny model (hf engine, torch backend): GRPO from its recipe, with a
KL term whose reference is the adapter-disabled model, trains two steps with adapter-only,
small checkpoints and writes the PEFT and merged exports; a resume is exact; and a weight
push broken on purpose stops the run (the adapter-reached-the-engine check).  Every other
estimator, correction and environment trains a step with an adapter in
tests/e2e/test_lora_components.py (a critic beside an adapted actor:
plugins/backends/torch/tests/test_lora.py)."""

from __future__ import annotations

import math
import shutil

import pytest
from conftest import ROOT, run_train, tiny_args
from safetensors.torch import load_file

from relax_core.reporting.metrics import read_metrics
from relax_core.run.exits import EXIT_ADAPTER_NOT_REACHED

LORA = ("--lora-rank", "4", "--lora-alpha", "8")


def test_grpo_trains_an_adapter_with_a_kl_reference_from_the_base_model(tiny_model_dir, prompts_file, tmp_path):
    recipe = ROOT / "examples" / "recipes" / "grpo.yaml"
    code, out = run_train(["--config", str(recipe), *tiny_args(tiny_model_dir, prompts_file, tmp_path), *LORA,
                           "--use-kl-loss", "--kl-loss-coef", "0.01", "--save-hf-merged"])
    assert code == 0, out
    run = tmp_path / "run"
    recs = read_metrics(run)
    assert [r["step"] for r in recs] == [1, 2]
    assert all(math.isfinite(r["train/loss"]) and r["train/skipped_steps"] == 0.0 for r in recs), recs
    assert "LoRA: the engine holds the adapted weights (step 1" in out
    ckpt = run / "checkpoints" / "step_000002" / "backend" / "actor.safetensors"
    actor = load_file(str(ckpt))
    assert actor and all(".lora_A." in k or ".lora_B." in k for k in actor)
    assert ckpt.stat().st_size < 0.01 * (tiny_model_dir / "model.safetensors").stat().st_size
    assert recs[0]["train/kl_loss"] == pytest.approx(0.0, abs=1e-7)  # B = 0: the adapted model is the base
    assert recs[1]["train/kl_loss"] != 0.0
    assert (run / "final" / "adapter_config.json").is_file() and (run / "final" / "merged" / "config.json").is_file()


def test_resume_of_a_lora_run_equals_the_uninterrupted_run(tiny_model_dir, prompts_file, tmp_path):
    args = lambda out: tiny_args(tiny_model_dir, prompts_file, out, *LORA, "--num-rollout", "2",  # noqa: E731
                                 "--save-interval", "1", "--lr", "1e-2", "--no-save-hf")
    code, out = run_train(args(tmp_path / "a"))
    assert code == 0, out
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "run" / "checkpoints" / "step_000002")  # as if killed during step 2
    code, out = run_train([*args(tmp_path / "b"), "--resume"])
    assert code == 0, out
    assert "resumed from step 1" in out
    strip = lambda recs: [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in recs]  # noqa: E731
    assert strip(read_metrics(tmp_path / "b" / "run")) == strip(read_metrics(tmp_path / "a" / "run"))
    final = lambda d: load_file(str(tmp_path / d / "run" / "checkpoints" / "step_000002" / "backend" /  # noqa: E731
                                    "actor.safetensors"))
    a, b = final("a"), final("b")
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


def test_a_push_that_never_reaches_the_engine_stops_the_run(tiny_model_dir, prompts_file, tmp_path, monkeypatch):
    from relax_hf.engine import HFEngine

    # an engine that ignores every weight call: no push lands, and nothing is released either
    monkeypatch.setattr(HFEngine, "update_weights", lambda self, state_dict, version, **kw: None)
    monkeypatch.setattr(HFEngine, "release_weights", lambda self: None)
    code, out = run_train(tiny_args(tiny_model_dir, prompts_file, tmp_path, *LORA, "--no-save-hf"))
    assert code == EXIT_ADAPTER_NOT_REACHED, out
    assert "the LoRA adapter did not reach the rollout engine 'hf': after the weight push of step 1" in out


@pytest.fixture
def adapter_engine(monkeypatch):
    """``--rollout-engine hf_adapters``: the hf engine declaring ``supports_lora_adapters``
    (tests/e2e/relax_toy_adapters.py), registered beside the installed plugins."""
    import relax_toy_adapters
    from relax_core.host import plugins

    monkeypatch.setattr(plugins, "_DEFAULT", plugins.load_registry(
        [("toy-adapters", relax_toy_adapters.Plugin(), "relax-toy-adapters", "0.1")]))
    relax_toy_adapters.ENGINES.clear()
    return relax_toy_adapters.ENGINES


def test_an_engine_that_takes_adapters_gets_the_adapter_alone_and_samples_as_with_merged_weights(
        tiny_model_dir, prompts_file, tmp_path, adapter_engine):
    """The push is the adapter (``AdapterWeights``), not the merged weights, where the engine
    declares ``supports_lora_adapters``; the run is the merged-weights run value for value
    (the engine applies the same ``W + (α/r) B A``), and ``--no-lora-engine-adapter`` pushes
    merged weights to it."""
    args = lambda out, *more: tiny_args(tiny_model_dir, prompts_file, out, *LORA, "--num-rollout", "2",  # noqa: E731
                                        "--lr", "1e-2", "--no-save-hf", "--rollout-engine", "hf_adapters", *more)
    code, out = run_train(args(tmp_path / "a"))
    assert code == 0, out
    assert "LoRA: the engine holds the adapted weights (step 1" in out
    assert adapter_engine[-1].pushed == ["adapter", "adapter"]
    code, out = run_train(args(tmp_path / "b", "--no-lora-engine-adapter"))
    assert code == 0, out
    assert adapter_engine[-1].pushed == ["weights", "weights"]
    strip = lambda recs: [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in recs]  # noqa: E731
    a, b = strip(read_metrics(tmp_path / "a" / "run")), strip(read_metrics(tmp_path / "b" / "run"))
    assert a[1]["rollout/raw_reward"] == b[1]["rollout/raw_reward"]  # step 2 sampled from the adapted weights
    assert [r.keys() for r in a] == [r.keys() for r in b]
    assert all(x == pytest.approx(y, rel=1e-5, abs=1e-6) for x, y in zip(a, b))


def test_an_adapter_push_that_never_reaches_the_engine_stops_the_run(tiny_model_dir, prompts_file, tmp_path,
                                                                     adapter_engine, monkeypatch):
    import relax_toy_adapters

    monkeypatch.setattr(relax_toy_adapters.AdapterHFEngine, "update_weights", lambda self, *a, **kw: None)
    code, out = run_train(tiny_args(tiny_model_dir, prompts_file, tmp_path, *LORA, "--no-save-hf",
                                    "--rollout-engine", "hf_adapters"))
    assert code == EXIT_ADAPTER_NOT_REACHED, out
    assert "the LoRA adapter did not reach the rollout engine 'hf_adapters'" in out


def test_a_lora_run_resumed_while_the_engine_lags_continues_as_the_uninterrupted_run(
        tiny_model_dir, prompts_file, tmp_path, adapter_engine):
    """``--update-weights-interval 2``: the checkpoint of step 3 holds the adapter of step 2,
    which the engine held (its tensors, its config in the trainer state); the resumed run
    gives it back, so step 4 samples as the uninterrupted run's did (the other kind of push
    on resume: tests/core/test_publisher.py)."""
    args = lambda out, steps, *more: tiny_args(tiny_model_dir, prompts_file, out, *LORA, "--num-rollout", str(steps),  # noqa: E731
                                               "--lr", "1e-2", "--no-save-hf", "--rollout-engine", "hf_adapters",
                                               "--update-weights-interval", "2", "--save-interval", "1", *more)
    code, out = run_train(args(tmp_path / "whole", 4))
    assert code == 0, out
    code, out = run_train(args(tmp_path / "cut", 3))
    assert code == 0, out
    assert adapter_engine[-1].pushed == ["adapter"]  # after step 2 only: the checkpoint of step 3 lags
    code, out = run_train(args(tmp_path / "cut", 4, "--resume"))
    assert code == 0, out
    assert adapter_engine[-1].pushed == ["adapter", "adapter"]  # the saved step-2 adapter, then step 4's
    strip = lambda recs: [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in recs]  # noqa: E731
    whole, cut = strip(read_metrics(tmp_path / "whole" / "run")), strip(read_metrics(tmp_path / "cut" / "run"))
    assert [r["step"] for r in cut] == [1, 2, 3, 4]
    assert cut[3] == pytest.approx(whole[3], rel=1e-5, abs=1e-6)
