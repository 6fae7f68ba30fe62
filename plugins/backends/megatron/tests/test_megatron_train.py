"""`relax train --train-backend megatron`: refused combinations at startup, and a 2-step
run on a tiny Qwen3 (hf engine, megatron backend) in a subprocess (Megatron's parallel
state and the CPU shim are per process)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relax_authoring.testing.fixtures import tiny_model_dir  # noqa: F401  (session fixture)

HERE = Path(__file__).resolve().parent


def _relax(args: list[str], **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
               WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    return subprocess.run([sys.executable, "-c", "from cli.main import app; app()", "train", *args],
                          capture_output=True, text=True, env=env, **kw)


def test_gpu_only_and_unsupported_parallelism_refused_at_startup():
    # CP needs CUDA + Transformer Engine (refused here with the reason); PP runs on CPU too
    r = _relax(["--train-backend", "megatron", "--context-parallel-size", "2", "--pipeline-parallel-size", "2",
                "--launcher", "ray", "--actor-num-gpus-per-node", "4", "--dry-run"], timeout=300)
    out = " ".join((r.stdout + r.stderr).split())
    if importlib.util.find_spec("transformer_engine") is None:
        assert r.returncode == 2, out
        assert "backend 'megatron'" in out and "[supports_context_parallel]" in out
        assert "supports context parallelism only with" in out and "transformer_engine module (not installed)" in out
    assert "supports_pipeline_parallel" not in out
    r = _relax(["--train-backend", "megatron", "--pipeline-parallel-size", "2", "--launcher", "ray",
                "--actor-num-gpus-per-node", "2", "--dry-run"], timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    # TP needs one training worker per TP rank: the Ray launcher
    r = _relax(["--train-backend", "megatron", "--tensor-parallel-size", "2", "--dry-run"], timeout=300)
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 2 and "supports_tensor_parallel" not in out
    assert "needs 2 training processes, but --launcher local starts one" in out
    assert "fix: use --launcher ray --actor-num-gpus-per-node 2" in out
    r = _relax(["--train-backend", "megatron", "--tensor-parallel-size", "2", "--launcher", "ray",
                "--actor-num-gpus-per-node", "2", "--dry-run"], timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")
def test_two_step_training_run(tiny_model_dir, tmp_path):  # noqa: F811
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + {i + 1}?", "label": str(2 * i + 1)}) + "\n"
                            for i in range(8)))
    r = _relax(["--train-backend", "megatron", "--model", str(tiny_model_dir), "--data", str(data),
                "--output-dir", str(tmp_path), "--run-name", "run",
                "--custom-rm-path", "relax_megatron_test_scorers:vowel_fraction", "--rollout-batch-size", "2",
                "--n-samples-per-prompt", "4", "--global-batch-size", "8", "--rollout-max-response-len", "8",
                "--num-rollout", "2", "--quiet", "--lr", "1e-3", "--seed", "3", "--reward-num-workers", "1",
                "--use-kl-loss", "--kl-loss-coef", "0.01", "--kl-loss-type", "k3", "--micro-batch-size", "4"], timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    from relax_core.reporting.metrics import read_metrics

    recs = read_metrics(tmp_path / "run")
    assert [x["step"] for x in recs] == [1, 2]
    for x in recs:
        assert math.isfinite(x["train/loss"]) and math.isfinite(x["train/grad_norm"]) and x["train/grad_norm"] > 0
        assert x["train/skipped_steps"] == 0.0
    assert recs[0]["train/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # step 1: actor = reference
    assert recs[1]["train/kl_loss"] > 0.0  # the megatron actor moved
    # the hf engine sampled with the weights megatron trained (pushed after step 1): its
    # log-probs equal the megatron forward's at every step
    for x in recs:
        assert x["train/train_rollout_logprob_abs_diff"] < 1e-4, x["train/train_rollout_logprob_abs_diff"]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final")
    assert model.config.num_hidden_layers == 2


def test_refused_combinations_name_the_capability():
    """Corrections and estimators needing what megatron does not declare are refused."""
    from relax_core.config import RunConfig
    from relax_core.host.plugins import default_registry
    from relax_core.host.validation import resolve

    reg = default_registry()
    cases = {"routing_replay": ("correction", "supports_routing_replay"), "ppo": ("estimator", "supports_critic")}
    for name, (kind, _) in cases.items():
        if name not in reg.names(kind):
            pytest.skip(f"{kind} {name} not installed")
    _, problems = resolve(RunConfig(train_backend="megatron", correction=("routing_replay",)), reg)
    assert any("does not support it" in p.message or "routing replay" in p.message for p in problems), problems
    _, problems = resolve(RunConfig(train_backend="megatron", advantage_estimator="ppo"), reg)
    assert any(p.constraint == "needs_critic" and "megatron" in p.message for p in problems), problems


def test_a_token_budget_it_cannot_honour_is_refused():
    """megatron micro-batches by --micro-batch-size only: --max-tokens-per-micro-batch is
    refused at startup instead of being ignored (issue 17)."""
    from relax_core.config import RunConfig
    from relax_core.host.plugins import default_registry
    from relax_core.host.validation import resolve

    _, problems = resolve(RunConfig(train_backend="megatron", max_tokens_per_micro_batch=4096), default_registry())
    hit = [p for p in problems if p.constraint == "supports_token_budget"]
    assert len(hit) == 1 and "--max-tokens-per-micro-batch 4096 would be ignored" in hit[0].message
    assert "--micro-batch-size" in hit[0].fix
    _, problems = resolve(RunConfig(max_tokens_per_micro_batch=4096), default_registry())  # torch packs
    assert not [p for p in problems if p.constraint == "supports_token_budget"]
