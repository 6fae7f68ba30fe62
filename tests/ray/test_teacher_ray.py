"""On-policy distillation under `--launcher ray` (synchronous; one engine actor, one training
rank, tiny models): the teacher is a worker of its own placement, its log-probs of the sampled
tokens reach the loss, and the run's metrics are the local run's."""

from __future__ import annotations

import pytest

from relax_authoring.testing.models import noisy_copy
from relax_ray_helpers import ray_and_local

OPD = ("--correction", "opd", "--num-rollout", "2")
KEYS = ("rollout/reward", "train/loss", "train/grad_norm", "opd/reverse_kl", "opd/advantage_term_abs_mean")


def test_teacher_on_ray_distils_as_the_local_run(tiny_model_dir, prompts_file, tmp_path, ray_local):
    teacher = noisy_copy(tiny_model_dir, tmp_path / "teacher", sigma=0.05, seed=1)
    ray, local, out = ray_and_local(tiny_model_dir, prompts_file, tmp_path, *OPD, "--teacher-model", str(teacher))
    assert f", the teacher worker {teacher}" in out  # the start-up line names what the teacher worker loads
    assert [r["step"] for r in ray] == [r["step"] for r in local] == [1, 2]
    for r, l in zip(ray, local):
        assert r["opd/reverse_kl"] != 0  # the teacher's log-probs arrived (a missing teacher would fail the run)
        for k in KEYS:
            assert r[k] == pytest.approx(l[k], rel=1e-6, abs=1e-10), (k, r[k], l[k])


def test_the_teacher_is_a_worker_of_its_own_placement_and_the_training_ranks_hold_no_copy(
        tiny_model_dir, tmp_path, ray_local):
    """``start_ray`` with ``--teacher-model``: a third placement group (training, rollout,
    teacher), the teacher's log-probs come from its own worker and equal a local torch
    backend's forward of the teacher, and a training rank has no teacher role."""
    import torch

    from relax_core.batch import Batch
    from relax_core.config import RunConfig, config_to_dict
    from relax_core.contracts import SamplingParams
    from relax_core.distributed.runtime import start_ray, teacher_config
    from relax_core.distributed.workers import build_component, config_from_dict
    from relax_core.models import load_tokenizer

    teacher = noisy_copy(tiny_model_dir, tmp_path / "teacher", sigma=0.05, seed=1)
    cfg = RunConfig(model=str(tiny_model_dir), teacher_model=str(teacher), launcher="ray", correction=("opd",))
    runtime = start_ray(cfg, config_to_dict(cfg), setup={}, corrections=["opd"], tokenizer=load_tokenizer(cfg.model))
    try:
        assert len(runtime.groups) == 3 and runtime.backend.teacher is not None
        assert runtime.backend.workers == runtime.workers[:1]  # one training rank; the teacher is not one
        prompts = [[1, 2, 3, 4], [5, 6, 7]]
        out = runtime.engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=6, seed=3))
        batch = Batch(**out.items(), prompt_ids=prompts, group_index=torch.arange(2))
        got = runtime.backend.forward(batch, role="teacher").log_probs
        student = runtime.backend.forward(batch, role="actor").log_probs
        with pytest.raises(ray_local.exceptions.RayTaskError, match="role 'teacher' was not built"):
            ray_local.get(runtime.backend.workers[0].forward.remote(batch.to_dict(), "teacher", False, False))
    finally:
        runtime.shutdown()
    local = build_component("backend", "torch", config_from_dict(teacher_config(config_to_dict(cfg))))
    local.setup()
    want = local.forward(batch, role="actor").log_probs
    mask = batch.loss_mask.bool()
    assert torch.allclose(got[mask], want[mask], atol=1e-6)
    assert (got[mask] - student[mask]).abs().max() > 1e-3  # the teacher worker holds the teacher, not the student
