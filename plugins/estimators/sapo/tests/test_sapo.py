"""relax-sapo: soft gate values and gradients (pinned by issue 3), temperatures by sign,
finiteness at extreme ratios, masking, dtypes, parameters."""


import pytest
import torch

from relax_core.config import RunConfig, build_config
from relax_core.contracts import AdvantageInput, PolicyLossInput
from relax_core.host.plugins import default_registry


def _spec():
    return default_registry().get("estimator", "sapo").spec


def _build(cfg=None, **params):
    spec = _spec()
    return spec.build(spec.params(**params), cfg or RunConfig())


def _inp(ratios, A, dtype=torch.float32):
    old = torch.full((1, len(ratios)), -1.5, dtype=dtype)
    lp = (old.double() + torch.log(torch.tensor([ratios], dtype=torch.float64))).to(dtype).requires_grad_(True)
    return PolicyLossInput(log_probs=lp, old_log_probs=old, advantages=torch.tensor([A], dtype=dtype),
                           loss_mask=torch.ones(1, len(ratios), dtype=torch.bool))


@pytest.mark.parametrize("r,A,f,grad", [
    (1.0, 1.0, 2.0, -1.0),
    (1.0, -1.0, 1.904762, 1.0),
    (1.5, 1.0, 2.489837, -1.410022),
    (1.5, -1.0, 2.393585, 1.401210),
    (0.5, 1.0, 1.510163, -0.470007),
])
def test_gate_values_and_gradient_from_issue(r, A, f, grad):
    inp = _inp([r], [A])
    out = _build().policy_loss(inp)
    assert out.loss.item() == pytest.approx(-f * A, abs=1e-6)
    out.loss.sum().backward()
    assert inp.log_probs.grad.item() == pytest.approx(grad, abs=1e-6)


def test_gradient_matches_formula_random_and_temperatures_follow_sign():
    g = torch.Generator().manual_seed(4)
    ratio = torch.exp(torch.randn(3, 8, generator=g) * 0.6)
    A = torch.randn(3, 8, generator=g)
    A[0, :2] = 0.0  # A = 0 uses tau_neg and has zero loss
    m = torch.rand(3, 8, generator=g) > 0.2
    old = -torch.rand(3, 8, generator=g)
    lp = (old + torch.log(ratio)).requires_grad_(True)
    out = _build(tau_pos=0.7, tau_neg=2.0).policy_loss(PolicyLossInput(log_probs=lp, old_log_probs=old, advantages=A, loss_mask=m))
    out.loss.sum().backward()
    tau = torch.where(A > 0, 0.7, 2.0)
    sig = torch.sigmoid(tau * (ratio - 1))
    torch.testing.assert_close(out.loss, torch.where(m, -(4 / tau) * sig * A, 0.0))
    torch.testing.assert_close(lp.grad, torch.where(m, -A * 4 * sig * (1 - sig) * ratio, 0.0))
    damp = m & (((A > 0) & (ratio > 1)) | ((A < 0) & (ratio < 1))) & (4 * sig * (1 - sig) < 0.9)
    assert torch.equal(out.token_metrics["pg_clipfrac"].bool(), damp)


def test_extreme_log_ratio_finite_and_mask_inert():
    lp = torch.tensor([[49.0, -60.0, float("nan")]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.0, 1e9]])
    A = torch.tensor([[-1.0, 1.0, float("nan")]])
    m = torch.tensor([[True, True, False]])
    out = _build().policy_loss(PolicyLossInput(log_probs=lp, old_log_probs=old, advantages=A, loss_mask=m))
    out.loss.sum().backward()
    assert torch.isfinite(out.loss).all() and torch.isfinite(lp.grad).all()
    # r = e^20 with A = −1: gate saturates at 4/τ_neg
    assert out.loss[0, 0].item() == pytest.approx(4 / 1.05)
    assert out.loss[0, 2].item() == 0.0 and lp.grad[0, 2].item() == 0.0


def test_bfloat16():
    inp = _inp([1.5, 0.5], [1.0, -1.0], dtype=torch.bfloat16)
    out = _build().policy_loss(inp)
    out.loss.sum().backward()
    assert out.loss.dtype == torch.float32 and inp.log_probs.grad.dtype == torch.bfloat16
    assert out.loss[0, 0].item() == pytest.approx(-2.489837, abs=2e-2)


def test_flags_and_defaults():
    reg = default_registry()
    cfg = build_config(cli={"advantage_estimator": "sapo", "sapo.tau_pos": 0.5, "sapo.tau_neg": 2.0},
                       param_schemas=reg.param_schemas())
    p = cfg.params_for("sapo")
    assert (p.tau_pos, p.tau_neg) == (0.5, 2.0)
    assert (_spec().params().tau_pos, _spec().params().tau_neg) == (1.0, 1.05)
    assert _spec().capabilities_for().behaviour_numerator == "old_log_probs"
    with pytest.raises(ValueError):
        _build(tau_pos=0.0).policy_loss(_inp([1.0], [1.0]))


def test_advantages_as_grpo_all_equal_group_zero():
    inp = AdvantageInput(rewards=torch.tensor([0.3, 0.3, 0.3]), group_index=torch.tensor([1, 1, 1]),
                         loss_mask=torch.ones(3, 2, dtype=torch.bool))
    out = _build().compute_advantages(inp)
    assert (out.advantages == 0).all() and out.metrics["rollout/zero_std_group_frac"] == 1.0


def test_contract():
    from relax_authoring.testing import check_contract

    check_contract(_spec())
