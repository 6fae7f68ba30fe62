"""LoRA under `--launcher ray` (synchronous; one engine actor, one training rank, tiny model):
the training worker's backend adapts the actor, pushes merged weights to the engine actor,
passes the adapter-reached-the-engine check, and the run's metrics are the local run's."""

from __future__ import annotations

import pytest

from relax_ray_helpers import ray_and_local

LORA = ("--lora-rank", "4", "--lora-alpha", "8", "--num-rollout", "2")
KEYS = ("rollout/reward", "rollout/response_len/mean", "train/loss", "train/grad_norm")


def test_lora_on_ray_trains_as_the_local_run(tiny_model_dir, prompts_file, tmp_path, ray_local):
    ray, local, out = ray_and_local(tiny_model_dir, prompts_file, tmp_path, *LORA)
    assert "LoRA: the engine holds the adapted weights (step 1" in out
    assert [r["step"] for r in ray] == [r["step"] for r in local] == [1, 2]
    for r, l in zip(ray, local):
        for k in KEYS:
            assert r[k] == pytest.approx(l[k], rel=1e-6, abs=1e-10), (k, r[k], l[k])
