"""`relax train --rollout-engine vllm`: runs on a tiny Llama (vLLM engine, torch backend) in
a subprocess; the engine's log-probs equal the trainer's at every step, so each weight push
reached vLLM: full fine-tuning, and LoRA with the adapter pushed alone (vLLM's native LoRA)
or merged (``--no-lora-engine-adapter``).  Runs where vLLM is installed (``.ci/vllm.sh``)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed (see .ci/vllm.sh)")]


def _train(tmp_path, name, *extra, steps=2):
    """Run ``relax train`` on the tiny Llama and vLLM; its metrics, run_info.json and stderr."""
    from vllm_tiny import make_tiny_llama

    from relax_core.reporting.metrics import read_metrics

    model = tmp_path / "model"
    if not model.exists():
        make_tiny_llama(model)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + {i + 1}?", "label": str(2 * i + 1)}) + "\n"
                            for i in range(8)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
               WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false", VLLM_CPU_KVCACHE_SPACE="1")
    args = ["--rollout-engine", "vllm", "--vllm-max-model-len", "256", "--model", str(model), "--data", str(data),
            "--output-dir", str(tmp_path), "--run-name", name, "--custom-rm-path", "vllm_test_scorers:vowel_fraction",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--global-batch-size", "8",
            "--rollout-max-response-len", "8", "--rollout-temperature", "0.8", "--num-rollout", str(steps), "--quiet",
            "--lr", "1e-3", "--seed", "3", "--reward-num-workers", "1", "--no-save-hf",
            "--no-bf16", *extra]  # float32 on every CPU: the log-probs are compared to 1e-4
    r = subprocess.run([sys.executable, "-c", "from cli.main import app; app()", "train", *args],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = read_metrics(tmp_path / name)
    assert [x["step"] for x in recs] == list(range(1, steps + 1))
    for x in recs:
        assert math.isfinite(x["train/loss"]) and x["train/skipped_steps"] == 0.0
        assert x["rollout/num_samples"] == 8.0
        # vLLM's log q (processed_logprobs at T = 0.8) equals the torch backend's log softmax(z / T)
        assert x["train/train_rollout_logprob_abs_diff"] < 1e-4, x["train/train_rollout_logprob_abs_diff"]
    return recs, json.loads((tmp_path / name / "run_info.json").read_text()), r.stderr


def test_two_step_training_run_with_vllm(tmp_path):
    _, info, _ = _train(tmp_path, "run")
    assert info["engine_weights"] == "state dict"


def test_lora_run_with_vllm_pushes_the_adapter_alone_and_samples_as_merged(tmp_path):
    """lr 3e-2 moves the adapter well past the engine/trainer mismatch by step 2, so steps 2-3
    sample from the adapted model (diff < 1e-4 at every step); the adapter push and the merged
    push give the same run."""
    lora = ["--lora-rank", "4", "--lora-alpha", "8", "--lr", "3e-2"]
    adapter, info, err = _train(tmp_path, "adapter", *lora, steps=3)
    assert info["engine_weights"] == "lora adapter"
    # the run's adapter check told the adapted model from the base model, and found the former
    assert "LoRA: the engine holds the adapted weights" in err, err[-3000:]
    merged, info, err = _train(tmp_path, "merged", *lora, "--no-lora-engine-adapter", steps=3)
    assert info["engine_weights"] == "state dict"
    assert "LoRA: the engine holds the adapted weights" in err, err[-3000:]
    for a, m in zip(adapter, merged):
        assert a["train/loss"] == pytest.approx(m["train/loss"], rel=1e-3, abs=1e-6)
        assert a["rollout/raw_reward"] == pytest.approx(m["rollout/raw_reward"], abs=1e-6)
