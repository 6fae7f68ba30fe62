"""`relax train --rollout-engine vllm`: a 2-step run on a tiny Llama (vLLM engine, torch
backend) in a subprocess; the engine's log-probs equal the trainer's at both steps, so the
weight push after step 1 reached vLLM.  Runs where vLLM is installed (``.ci/vllm.sh``)."""

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


def test_two_step_training_run_with_vllm(tmp_path):
    from vllm_tiny import make_tiny_llama

    model = make_tiny_llama(tmp_path / "model")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + {i + 1}?", "label": str(2 * i + 1)}) + "\n"
                            for i in range(8)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
               WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false", VLLM_CPU_KVCACHE_SPACE="1")
    args = ["--rollout-engine", "vllm", "--vllm-max-model-len", "256", "--model", str(model), "--data", str(data),
            "--output-dir", str(tmp_path), "--run-name", "run", "--custom-rm-path", "vllm_test_scorers:vowel_fraction",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--global-batch-size", "8",
            "--rollout-max-response-len", "8", "--rollout-temperature", "0.8", "--num-rollout", "2", "--quiet",
            "--lr", "1e-3", "--seed", "3", "--reward-num-workers", "1", "--no-save-hf"]
    r = subprocess.run([sys.executable, "-c", "from cli.main import app; app()", "train", *args],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    from relax_core.reporting.metrics import read_metrics

    recs = read_metrics(tmp_path / "run")
    assert [x["step"] for x in recs] == [1, 2]
    for x in recs:
        assert math.isfinite(x["train/loss"]) and x["train/skipped_steps"] == 0.0
        assert x["rollout/num_samples"] == 8.0
        # vLLM's log q (processed_logprobs at T = 0.8) equals the torch backend's log softmax(z / T)
        assert x["train/train_rollout_logprob_abs_diff"] < 1e-4, x["train/train_rollout_logprob_abs_diff"]
