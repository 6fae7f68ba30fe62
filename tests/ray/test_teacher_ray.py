"""On-policy distillation under `--launcher ray` (synchronous; one engine actor, one training
rank, tiny models): the training rank loads the teacher beside the actor, its log-probs of the
sampled tokens reach the loss, and the run's metrics are the local run's."""

from __future__ import annotations

import pytest

from relax_authoring.testing.models import noisy_copy
from relax_ray_helpers import ray_and_local

OPD = ("--correction", "opd", "--num-rollout", "2")
KEYS = ("rollout/reward", "train/loss", "train/grad_norm", "opd/reverse_kl", "opd/advantage_term_abs_mean")


def test_teacher_on_ray_distils_as_the_local_run(tiny_model_dir, prompts_file, tmp_path, ray_local):
    teacher = noisy_copy(tiny_model_dir, tmp_path / "teacher", sigma=0.05, seed=1)
    ray, local, _ = ray_and_local(tiny_model_dir, prompts_file, tmp_path, *OPD, "--teacher-model", str(teacher))
    assert [r["step"] for r in ray] == [r["step"] for r in local] == [1, 2]
    for r, l in zip(ray, local):
        assert r["opd/reverse_kl"] != 0  # the teacher's log-probs arrived (a missing teacher would fail the run)
        for k in KEYS:
            assert r[k] == pytest.approx(l[k], rel=1e-6, abs=1e-10), (k, r[k], l[k])
