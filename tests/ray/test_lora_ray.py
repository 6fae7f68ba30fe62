"""LoRA under `--launcher ray` (synchronous; one engine actor, one training rank, tiny model):
the training worker's backend adapts the actor, pushes merged weights to the engine actor,
passes the adapter-reached-the-engine check, and the run's metrics are the local run's."""

from __future__ import annotations

import pytest
import train_helpers

from relax_core.reporting.metrics import read_metrics
from relax_ray_helpers import ray_args, run_train

LORA = ("--lora-rank", "4", "--lora-alpha", "8", "--num-rollout", "2")
KEYS = ("rollout/reward", "rollout/response_len/mean", "train/loss", "train/grad_norm")


def test_lora_on_ray_trains_as_the_local_run(tiny_model_dir, prompts_file, tmp_path, ray_local):
    code, out = run_train(ray_args(tiny_model_dir, prompts_file, tmp_path, "ray", *LORA))
    assert code == 0, out
    assert "LoRA: the engine holds the adapted weights (step 1" in out
    local_args = train_helpers.tiny_args(tiny_model_dir, prompts_file, tmp_path, "--no-save-hf", *LORA,
                                         scorer="relax_ray_scorers:vowel_fraction", lr="1e-2", name="local")
    code, out = run_train(local_args)
    assert code == 0, out
    ray, local = read_metrics(tmp_path / "ray"), read_metrics(tmp_path / "local")
    assert [r["step"] for r in ray] == [r["step"] for r in local] == [1, 2]
    for r, l in zip(ray, local):
        for k in KEYS:
            assert r[k] == pytest.approx(l[k], rel=1e-6, abs=1e-10), (k, r[k], l[k])
