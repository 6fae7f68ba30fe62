"""``--compile-loss``: the actor loss through ``torch.compile`` gives the eager loss, gradient
and metrics for every installed estimator and correction, does not recompile when the
micro-batch shape changes, and falls back to eager (with a warning) when compiling fails."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch

from relax_core import PPOClipParams
from relax_core.batch import Batch
from relax_core.config import RunConfig
from relax_core.contracts import AdvantageInput, ForwardOutput
from relax_core.host.plugins import default_registry
from relax_core.stages.loss import ActorLoss, LossSettings, global_denominators

ESTIMATORS = ("grpo", "rloo", "cispo", "gspo", "sapo", "m2po", "ppo", "reinforce_plus_plus",
              "reinforce_plus_plus_baseline")
VARIANTS = [(e, ()) for e in ESTIMATORS] + [("grpo", ("tis",)), ("reinforce_plus_plus", ("icepop",))]


def test_flag_default_off_and_carried_into_the_loss_settings():
    assert RunConfig().compile_loss is False
    cfg = RunConfig(compile_loss=True)
    assert LossSettings.from_config(cfg, "ppo_clip").compile_loss is True


def _batch(B: int, T: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Prefix masks (one sample fully masked), groups of 4, NaN / 1e9 garbage in every
    masked slot of every token input (it must reach neither the loss nor the gradient)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[1] = 0
    mask = torch.arange(T)[None, :] < lengths[:, None]
    junk = torch.where(torch.arange(T)[None, :] % 2 == 0, math.nan, 1e9).expand(B, T)

    def tok(x):
        return torch.where(mask, x, junk)

    old = -3 * torch.rand(B, T, generator=g)
    return dict(
        mask=mask, lengths=lengths, group_index=torch.arange(B) // 4,
        rewards=torch.randint(0, 2, (B,), generator=g).float(),
        old=tok(old), log_probs=tok(old + 0.3 * torch.randn(B, T, generator=g)),
        rollout=tok(old + 0.2 * torch.randn(B, T, generator=g)), ref=tok(old + 0.2 * torch.randn(B, T, generator=g)),
        values=tok(torch.rand(B, T, generator=g)), entropy=tok(torch.rand(B, T, generator=g)))


class Stage:
    """An estimator (and corrections) built from the installed plugins, and one actor-loss
    micro-batch through ``ActorLoss`` as the trainer builds it."""

    def __init__(self, est: str, corr: tuple[str, ...], *, compile_loss: bool, use_kl_loss: bool = False) -> None:
        reg = default_registry()
        self.cfg = RunConfig(advantage_estimator=est, correction=corr, n_samples_per_prompt=4,
                             calculate_per_token_loss=est in ("rloo", "cispo"), compile_loss=compile_loss,
                             kl_coef=0.01 if est == "reinforce_plus_plus" else 0.0, use_kl_loss=use_kl_loss,
                             kl_loss_coef=0.1 if use_kl_loss else 0.0, entropy_coef=0.01)
        spec = reg.get("estimator", est).spec
        params = spec.default_params()
        if isinstance(params, PPOClipParams):  # an upper margin that binds on these inputs
            params = dataclasses.replace(params, eps_clip_high=0.28)
        if est == "m2po":  # a budget that binds on these inputs
            params = spec.params(kl2_budget=0.01, miniclip_low=0.05, miniclip_high=0.05)
        self.est = spec.build(params, self.cfg)
        self.corrections = []
        for c in corr:
            cspec = reg.get("correction", c).spec
            self.corrections.append(cspec.build(cspec.default_params(), self.cfg))
        self.settings = LossSettings.from_config(self.cfg, spec.capabilities_for(params).behaviour_numerator)
        self.kind = est

    def __call__(self, b: dict) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        mask = b["mask"]
        out = self.est.compute_advantages(AdvantageInput(
            rewards=b["rewards"], group_index=b["group_index"], loss_mask=mask, old_log_probs=b["old"],
            ref_log_probs=b["ref"], values=b["values"], response_lengths=b["lengths"]))
        tensors = {"advantages": out.advantages, "old_log_probs": b["old"], "rollout_log_probs": b["rollout"],
                   "ref_log_probs": b["ref"]}
        tb = Batch(response_ids=mask.long(), loss_mask=mask, **tensors)
        tokens, samples = global_denominators(mask)
        fn = ActorLoss(self.est, self.corrections, self.settings, num_tokens=tokens, num_samples=samples,
                       old_from_current=False)
        lp = b["log_probs"].clone().requires_grad_(True)
        loss, _ = fn(tb, ForwardOutput(log_probs=lp, entropy=b["entropy"]))
        loss.backward()
        return loss.detach(), lp.grad, fn.metrics()


@pytest.mark.slow
@pytest.mark.parametrize("est,corr", VARIANTS, ids=["+".join((e, *c)) for e, c in VARIANTS])
def test_compiled_loss_equals_eager(est, corr):
    b = _batch(12, 20)
    use_kl = est == "grpo" and not corr  # the KL-loss term once
    from torch._dynamo.utils import counters

    l0, g0, m0 = Stage(est, corr, compile_loss=False, use_kl_loss=use_kl)(b)
    graphs = counters["stats"]["unique_graphs"]
    l1, g1, m1 = Stage(est, corr, compile_loss=True, use_kl_loss=use_kl)(b)
    assert counters["stats"]["unique_graphs"] > graphs  # compiled indeed (no silent eager fallback)
    assert torch.isfinite(l0) and torch.isfinite(g0).all()
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(g1, g0, rtol=1e-5, atol=1e-8)
    assert (g1[~b["mask"]] == 0).all()
    assert m1.keys() == m0.keys() and {"train/pg_loss", "train/pg_clipfrac", "train/entropy"} <= m0.keys()
    for k in m0:
        assert m1[k] == pytest.approx(m0[k], rel=1e-5, abs=1e-7), k


@pytest.mark.cuda
@pytest.mark.parametrize("est,corr", [("grpo", ("tis",)), ("ppo", ())], ids=["grpo+tis", "ppo"])
def test_compiled_loss_equals_eager_on_cuda(est, corr):
    """``--compile-loss`` on CUDA (inductor's Triton kernels, not the CPU C++ ones): the
    same loss, gradient and metrics as eager on the same CUDA tensors, compiled for real
    (no fallback to eager: that warns "--compile-loss: torch.compile failed")."""
    from torch._dynamo.utils import counters

    b = {k: v.cuda() for k, v in _batch(12, 20).items()}
    l0, g0, m0 = Stage(est, corr, compile_loss=False)(b)
    graphs = counters["stats"]["unique_graphs"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        l1, g1, m1 = Stage(est, corr, compile_loss=True)(b)
    assert not [w for w in caught if "--compile-loss" in str(w.message)]
    assert counters["stats"]["unique_graphs"] > graphs
    assert g1.device.type == "cuda" and torch.isfinite(l0) and torch.isfinite(g0).all()
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(g1, g0, rtol=1e-5, atol=1e-8)
    assert (g1[~b["mask"]] == 0).all()
    for k in m0:
        assert m1[k] == pytest.approx(m0[k], rel=1e-5, abs=1e-7), k


@pytest.mark.slow
def test_new_micro_batch_shapes_do_not_recompile():
    from torch._dynamo.utils import counters

    stage = Stage("grpo", ("tis",), compile_loss=True)
    stage(_batch(8, 16, seed=1))
    graphs = counters["stats"]["unique_graphs"]
    eager = Stage("grpo", ("tis",), compile_loss=False)
    for B, T in ((12, 24), (16, 40), (10, 33)):
        b = _batch(B, T, seed=B)
        l1, g1, _ = stage(b)
        l0, g0, _ = eager(b)
        torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(g1, g0, rtol=1e-5, atol=1e-8)
    assert counters["stats"]["unique_graphs"] - graphs <= 1  # at most one recompile for three new shapes


def _no_compiler():
    """A backend failing on the forward, as inductor does without a working C++ compiler / Triton."""
    def no_compiler(gm, example_inputs):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    return no_compiler


def _no_backward_compiler():
    """A backend failing only on the backward: AOTAutograd compiles it lazily, at
    ``loss.backward()``, so the first call's check must catch it, not the backend's backward."""
    from torch._dynamo.backends.common import aot_autograd

    def no_backward(gm, example_inputs):
        raise RuntimeError("CppCompileError: simulated backward compile failure")

    return aot_autograd(fw_compiler=lambda gm, ex: gm, bw_compiler=no_backward)


@pytest.mark.slow
@pytest.mark.parametrize("make_backend, message", [(_no_compiler, "backend='no_compiler'"),
                                                    (_no_backward_compiler, "simulated backward")])
def test_a_failing_compiler_falls_back_to_eager_with_a_warning(monkeypatch, make_backend, message):
    backend = make_backend()
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compile_(fn, backend=backend, **kw))
    b = _batch(8, 12, seed=3)
    stage = Stage("grpo", (), compile_loss=True)
    with pytest.warns(RuntimeWarning, match=f"--compile-loss: torch.compile failed.*{message}"):
        l1, g1, m1 = stage(b)
    l0, g0, m0 = Stage("grpo", (), compile_loss=False)(b)
    torch.testing.assert_close(l1, l0)
    torch.testing.assert_close(g1, g0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: the next micro-batch runs eager silently
        stage(b)
    assert m1 == pytest.approx(m0)
