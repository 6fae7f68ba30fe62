"""LoRA under `--launcher ray` (synchronous; one engine actor, one training rank, tiny model):
the training rank's adapter reaches the driver for adapter-taking engines (``engine_adapter``);
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


def test_the_ray_backend_gives_the_training_rank_s_adapter(tiny_model_dir, ray_local):
    """``RayBackend.engine_adapter``: an ObjectRef of the training rank's
    :class:`~relax_core.contracts.AdapterWeights` (what an adapter-taking engine actor gets),
    CPU tensors equal to a local backend's adapter for the same config and seed (A is random,
    B zero at initialisation)."""
    import torch

    from relax_core.config import RunConfig, config_to_dict
    from relax_core.contracts import AdapterWeights
    from relax_core.distributed.proxies import RayBackend
    from relax_core.distributed.runtime import start_train_group
    from relax_core.distributed.workers import build_component

    cfg = RunConfig(model=str(tiny_model_dir), lora_rank=4, lora_alpha=8.0, device="cpu", launcher="ray", seed=7)
    workers = start_train_group(config_to_dict(cfg), 1, {}, [], [{"num_cpus": 1}])
    try:
        got = ray_local.get(RayBackend(workers).engine_adapter())
    finally:
        for w in workers:
            ray_local.kill(w, no_restart=True)
    torch.manual_seed(cfg.seed)  # as TrainWorker.configure: the adapter's A is drawn from it
    local = build_component("backend", "torch", cfg)
    local.setup()
    want = local.engine_adapter()
    assert isinstance(got, AdapterWeights) and got.config == want.config and got.config["r"] == 4
    assert got.tensors.keys() == want.tensors.keys() and any("lora_A" in k for k in got.tensors)
    for k, v in want.tensors.items():
        assert got.tensors[k].device.type == "cpu" and torch.equal(got.tensors[k], v), k
