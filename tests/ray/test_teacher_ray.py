"""On-policy distillation under `--launcher ray` (synchronous; one engine actor, one training
rank, tiny models): the training rank loads the teacher beside the actor, its log-probs of the
sampled tokens reach the loss, and the run's metrics are the local run's."""

from __future__ import annotations

import pytest
import torch
import train_helpers

from relax_core.reporting.metrics import read_metrics
from relax_ray_helpers import ray_args, run_train

OPD = ("--correction", "opd", "--num-rollout", "2")
KEYS = ("rollout/reward", "train/loss", "train/grad_norm", "opd/reverse_kl", "opd/advantage_term_abs_mean")


def _noisy_copy(src, dst, sigma=0.05):
    """``src`` with N(0, sigma²) added to every matrix (a teacher that disagrees a little)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.add_(torch.randn(p.shape, generator=g) * sigma)
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return dst


def test_teacher_on_ray_distils_as_the_local_run(tiny_model_dir, prompts_file, tmp_path, ray_local):
    teacher = _noisy_copy(tiny_model_dir, tmp_path / "teacher")
    flags = (*OPD, "--teacher-model", str(teacher))
    code, out = run_train(ray_args(tiny_model_dir, prompts_file, tmp_path, "ray", *flags))
    assert code == 0, out
    local_args = train_helpers.tiny_args(tiny_model_dir, prompts_file, tmp_path, "--no-save-hf", *flags,
                                         scorer="relax_ray_scorers:vowel_fraction", lr="1e-2", name="local")
    code, out = run_train(local_args)
    assert code == 0, out
    ray, local = read_metrics(tmp_path / "ray"), read_metrics(tmp_path / "local")
    assert [r["step"] for r in ray] == [r["step"] for r in local] == [1, 2]
    for r, l in zip(ray, local):
        assert r["opd/reverse_kl"] != 0  # the teacher's log-probs arrived (a missing teacher would fail the run)
        for k in KEYS:
            assert r[k] == pytest.approx(l[k], rel=1e-6, abs=1e-10), (k, r[k], l[k])
