"""relax_core.policy: PPO-clip (asymmetric, dual), clipfrac, REINFORCE, masking, dtypes."""

import math

import pytest
import torch

from relax_core.policy import masked_log_ratio, ppo_clip, ppo_clip_loss, reinforce_loss


def _lp(ratio, old=-1.0, dtype=torch.float32):
    """log π_θ giving the requested ratios against log π_old = ``old``."""
    r = torch.tensor(ratio, dtype=torch.float64)
    lp = (torch.log(r) + old).to(dtype).requires_grad_(True)
    return lp, torch.full(r.shape, old, dtype=dtype)


def test_clipfrac_counts_only_binding_side():
    lp, old = _lp([[0.5, 0.5, 1.5, 1.5]])
    A = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    out = ppo_clip_loss(lp, old, A, torch.ones(1, 4, dtype=torch.bool), 0.2)
    assert out.token_metrics["pg_clipfrac"].tolist() == [[0.0, 1.0, 0.0, 1.0]]
    assert out.token_metrics["pg_clipfrac"].mean().item() == 0.5
    # losses: max(-rA, -clip(r)A) = [-0.5, 0.8, 1.5, -1.2]
    torch.testing.assert_close(out.loss, torch.tensor([[-0.5, 0.8, 1.5, -1.2]]))
    out.loss.sum().backward()
    # d/d log π: -A·r on the unclipped branch, 0 where clipped
    torch.testing.assert_close(lp.grad, torch.tensor([[-0.5, 0.0, 1.5, 0.0]]))


def test_asymmetric_clip_and_ppo_kl():
    lp, old = _lp([[1.5, 0.7]])
    A = torch.tensor([[1.0, -1.0]])
    out = ppo_clip_loss(lp, old, A, torch.ones(1, 2, dtype=torch.bool), 0.2, eps_clip_high=0.28)
    torch.testing.assert_close(out.loss, torch.tensor([[-1.28, 0.8]]))
    torch.testing.assert_close(out.token_metrics["ppo_kl"], torch.tensor([[-math.log(1.5), -math.log(0.7)]]))


def test_rloo_reference_values_at_ratio_one_and_1p5():
    A = torch.tensor([[1.0, -1 / 3, -1 / 3, -1 / 3]])
    m = torch.ones(1, 4, dtype=torch.bool)
    lp, old = _lp([[1.0] * 4])
    out = ppo_clip_loss(lp, old, A, m, 0.2)
    torch.testing.assert_close(out.loss, torch.tensor([[-1.0, 1 / 3, 1 / 3, 1 / 3]]))
    assert out.token_metrics["pg_clipfrac"].sum() == 0
    lp, old = _lp([[1.5] * 4])
    out = ppo_clip_loss(lp, old, A, m, 0.2)
    torch.testing.assert_close(out.loss, torch.tensor([[-1.2, 0.5, 0.5, 0.5]]))
    assert out.token_metrics["pg_clipfrac"].tolist() == [[1.0, 0.0, 0.0, 0.0]]


def test_dual_clip_applies_to_negative_advantages_only():
    lp, old = _lp([[4.0, 2.0, 4.0]])
    A = torch.tensor([[-1.0, -1.0, 1.0]])
    out = ppo_clip_loss(lp, old, A, torch.ones(1, 3, dtype=torch.bool), 0.2, eps_clip_c=3.0)
    # A<0, r=4: max(4, 1.2)=4 → min(4, 3·1)=3 (clipped); r=2: 2 < 3 unclipped; A>0: -1.2
    torch.testing.assert_close(out.loss, torch.tensor([[3.0, 2.0, -1.2]]))
    assert out.token_metrics["pg_clipfrac"].tolist() == [[1.0, 0.0, 1.0]]
    out.loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, 2.0, 0.0]]))
    without = ppo_clip_loss(lp.detach(), old, A, torch.ones(1, 3, dtype=torch.bool), 0.2)
    assert without.loss[0, 0].item() == pytest.approx(4.0)
    with pytest.raises(ValueError):
        ppo_clip(torch.ones(1), torch.ones(1), 0.2, 0.2, eps_clip_c=1.0)


def test_gradient_autograd_matches_formula_random():
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 9, generator=g) * 3
    lp = (old + torch.randn(6, 9, generator=g) * 0.4).requires_grad_(True)
    A = torch.randn(6, 9, generator=g)
    m = torch.rand(6, 9, generator=g) > 0.3
    out = ppo_clip_loss(lp, old, A, m, 0.2, 0.28, 3.0)
    out.loss.sum().backward()
    r = torch.exp(lp.detach() - old)
    binding = ((A > 0) & (r > 1.28)) | ((A < 0) & (r < 0.8)) | ((A < 0) & (r > 3.0))
    expected = torch.where(m & ~binding, -A * r, torch.zeros(()))
    torch.testing.assert_close(lp.grad, expected)


def test_masked_garbage_changes_neither_loss_nor_gradient():
    m = torch.tensor([[True, False], [True, False]])
    A = torch.tensor([[1.0, 1e9], [-1.0, float("nan")]])
    grads, losses = [], []
    for bad in (float("nan"), 1e9, -5.0):
        lp = torch.tensor([[-1.0, bad], [-2.0, bad]], requires_grad=True)
        old = torch.tensor([[-1.1, bad], [-1.9, -bad]])
        for fn in (lambda: ppo_clip_loss(lp, old, A, m, 0.2, eps_clip_c=3.0), lambda: reinforce_loss(lp, old, A, m)):
            out = fn()
            assert torch.isfinite(out.loss).all()
            lp.grad = None
            out.loss.sum().backward()
            assert torch.isfinite(lp.grad).all() and (lp.grad[:, 1] == 0).all()
            losses.append(out.loss.detach().clone())
            grads.append(lp.grad.clone())
    for i in range(2, len(losses)):
        torch.testing.assert_close(losses[i], losses[i % 2])
        torch.testing.assert_close(grads[i], grads[i % 2])


def test_reinforce_gradient_is_minus_advantage():
    lp = torch.tensor([[-2.0, -0.5, 7.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.0, 0.0]])
    A = torch.tensor([[0.75, -0.25, 3.0]])
    m = torch.tensor([[True, True, False]])
    out = reinforce_loss(lp, old, A, m)
    torch.testing.assert_close(out.loss, torch.tensor([[1.5, -0.125, 0.0]]))
    out.loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-0.75, 0.25, 0.0]]))
    assert out.token_metrics["pg_clipfrac"].sum() == 0
    torch.testing.assert_close(out.token_metrics["ppo_kl"], torch.tensor([[1.0, -0.5, 0.0]]))


def test_extreme_log_ratio_stays_finite():
    lp = torch.tensor([[49.0, -51.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.0]])
    A = torch.tensor([[-1.0, 1.0]])
    out = ppo_clip_loss(lp, old, A, torch.ones(1, 2, dtype=torch.bool), 0.2)
    out.loss.sum().backward()
    assert torch.isfinite(out.loss).all() and torch.isfinite(lp.grad).all()
    assert masked_log_ratio(lp, old, torch.ones(1, 2, dtype=torch.bool)).tolist() == [[20.0, -20.0]]


def test_bfloat16_inputs_compute_in_float32():
    lp32, old32 = _lp([[0.9, 1.1, 1.3]])
    lp16 = lp32.detach().to(torch.bfloat16).requires_grad_(True)
    A = torch.tensor([[1.0, -0.5, 1.0]])
    m = torch.ones(1, 3, dtype=torch.bool)
    out16 = ppo_clip_loss(lp16, old32.to(torch.bfloat16), A.to(torch.bfloat16), m, 0.2)
    assert out16.loss.dtype == torch.float32
    out16.loss.sum().backward()
    assert lp16.grad.dtype == torch.bfloat16
    out32 = ppo_clip_loss(lp32, old32, A, m, 0.2)
    torch.testing.assert_close(out16.loss, out32.loss, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("name", ["grpo", "gspo", "sapo", "cispo"])
def test_group_mean_estimators_take_the_block_options(name):
    """The four GroupMeanAdvantages estimators read --disable-grpo-std-normalization from
    their parameters and --disable-rewards-normalization from the run config (rewards
    [1, 0] in one group: GRPO ±1/(√0.5 + 1e-6), Dr.GRPO ±0.5, raw rewards 1 and 0)."""
    from relax_core.config import RunConfig
    from relax_core.contracts import AdvantageInput
    from relax_core.host.plugins import default_registry

    spec = default_registry().get("estimator", name).spec
    inp = AdvantageInput(rewards=torch.tensor([1.0, 0.0]), group_index=torch.tensor([0, 0]),
                         loss_mask=torch.ones(2, 1, dtype=torch.bool))
    def adv(cfg=None, **params):
        return spec.build(spec.params(**params), cfg).compute_advantages(inp).advantages[:, 0]

    a = 0.5 / (0.5 ** 0.5 + 1e-6)
    torch.testing.assert_close(adv(), torch.tensor([a, -a]))
    torch.testing.assert_close(adv(disable_grpo_std_normalization=True), torch.tensor([0.5, -0.5]))
    torch.testing.assert_close(adv(RunConfig(disable_rewards_normalization=True)), torch.tensor([1.0, 0.0]))
