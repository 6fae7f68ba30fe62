"""relax-cispo: clipped stop-gradient IS weight (values pinned by issue 3), gradient through
log π only, masking, dtypes, advantages as GRPO, capabilities."""


import pytest
import torch

from relax_core.config import RunConfig, build_config
from relax_core.contracts import AdvantageInput, PolicyLossInput
from relax_core.host.plugins import default_registry
from relax_core.host.validation import resolve

NAN = float("nan")


def _spec():
    return default_registry().get("estimator", "cispo").spec


def _build(cfg=None, **params):
    spec = _spec()
    return spec.build(spec.params(**params), cfg or RunConfig())


def _inp(log_pi, ratio, A, mask=None, dtype=torch.float32):
    lp = torch.tensor(log_pi, dtype=dtype).requires_grad_(True)
    old = (torch.tensor(log_pi, dtype=torch.float64) - torch.log(torch.tensor(ratio, dtype=torch.float64))).to(dtype)
    m = torch.ones(lp.shape, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return PolicyLossInput(log_probs=lp, old_log_probs=old, advantages=torch.tensor(A, dtype=dtype), loss_mask=m)


def test_weight_values_and_gradient_from_issue():
    inp = _inp([[-1.0]], [[1.5]], [[1.0]])
    out = _build(eps_clip=0.2, eps_clip_high=0.28).policy_loss(inp)
    assert out.loss.item() == pytest.approx(-1.28 * 1.0 * -1.0)  # ŵ = 1.28
    out.loss.sum().backward()
    assert inp.log_probs.grad.item() == pytest.approx(-1.28)
    assert out.token_metrics["pg_clipfrac"].item() == 1.0
    inp = _inp([[-1.0]], [[0.5]], [[1.0]])
    out = _build(eps_clip=0.2).policy_loss(inp)
    out.loss.sum().backward()
    assert inp.log_probs.grad.item() == pytest.approx(-0.8)  # ŵ = 0.8 (lower clip lifts the weight)
    assert out.token_metrics["pg_clipfrac"].item() == 0.0  # A > 0: the lower side does not bind


def test_stop_gradient_on_the_weight():
    # log π = −2, r = 1.1, A = +1: d L/d log π = −ŵ·A = −1.1 exactly (without sg: +1.1)
    inp = _inp([[-2.0]], [[1.1]], [[1.0]])
    out = _build().policy_loss(inp)
    assert out.loss.item() == pytest.approx(2.2)
    out.loss.sum().backward()
    assert inp.log_probs.grad.item() == pytest.approx(-1.1, abs=1e-6)


def test_gradient_matches_formula_random_and_mask_is_inert():
    g = torch.Generator().manual_seed(1)
    lp0 = -torch.rand(4, 6, generator=g) * 3
    ratio = torch.exp(torch.randn(4, 6, generator=g) * 0.5)
    A = torch.randn(4, 6, generator=g)
    m = torch.rand(4, 6, generator=g) > 0.3
    m[1] = False
    lp = lp0.clone().requires_grad_(True)
    old = lp0 - torch.log(ratio)
    out = _build(eps_clip=0.2, eps_clip_high=0.28).policy_loss(PolicyLossInput(log_probs=lp, old_log_probs=old, advantages=A, loss_mask=m))
    out.loss.sum().backward()
    w = ratio.clamp(0.8, 1.28)
    torch.testing.assert_close(lp.grad, torch.where(m, -w * A, torch.zeros(())))
    expect_clip = m & (((A > 0) & (ratio > 1.28)) | ((A < 0) & (ratio < 0.8)))
    assert torch.equal(out.token_metrics["pg_clipfrac"].bool(), expect_clip)
    # garbage in masked slots changes nothing
    lp2 = torch.where(m, lp0, torch.full_like(lp0, NAN)).requires_grad_(True)
    out2 = _build(eps_clip=0.2, eps_clip_high=0.28).policy_loss(PolicyLossInput(
        log_probs=lp2, old_log_probs=torch.where(m, old, 1e9), advantages=torch.where(m, A, NAN), loss_mask=m))
    out2.loss.sum().backward()
    torch.testing.assert_close(out2.loss, out.loss)
    torch.testing.assert_close(lp2.grad, lp.grad)


def test_bfloat16():
    inp = _inp([[-2.0, -1.0]], [[1.1, 0.5]], [[1.0, -1.0]], dtype=torch.bfloat16)
    out = _build().policy_loss(inp)
    out.loss.sum().backward()
    assert out.loss.dtype == torch.float32 and inp.log_probs.grad.dtype == torch.bfloat16
    torch.testing.assert_close(inp.log_probs.grad.float(), torch.tensor([[-1.1, 0.8]]), atol=1e-2, rtol=1e-2)


def test_advantages_are_grpo_advantages():
    inp = AdvantageInput(rewards=torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0]), group_index=torch.tensor([0, 0, 0, 0, 1, 1]),
                         loss_mask=torch.tensor([[True, True]] * 5 + [[False, False]]))
    out = _build().compute_advantages(inp)
    torch.testing.assert_close(out.advantages[:4, 0], torch.tensor([1.499997, -0.499999, -0.499999, -0.499999]), atol=1e-6, rtol=0)
    assert (out.advantages[4:] == 0).all() and out.metrics["rollout/zero_std_group_frac"] == 0.5
    out = _build(disable_grpo_std_normalization=True).compute_advantages(inp)
    torch.testing.assert_close(out.advantages[:4, 1], torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_capabilities_and_recommendation_shown():
    spec = _spec()
    c = spec.capabilities_for()
    assert c.behaviour_numerator == "old_log_probs" and c.requires_per_token_loss and c.min_group_size == 2
    assert "--eps-clip-high 10" in spec.summary
    reg = default_registry()
    cfg = build_config(cli={"advantage_estimator": "cispo", "kl_coef": 0.1}, param_schemas=reg.param_schemas())
    assert "uses_options" in [p.constraint for p in resolve(cfg, reg)[1]]
    cfg = build_config(cli={"advantage_estimator": "cispo", "eps_clip_c": 3.0}, param_schemas=reg.param_schemas())
    assert "unread option" in [p.constraint for p in resolve(cfg, reg)[1]]  # CISPO has no dual clip
    cfg = build_config(cli={"advantage_estimator": "cispo", "eps_clip": 0.3, "calculate_per_token_loss": True},
                       param_schemas=reg.param_schemas())
    assert resolve(cfg, reg)[1] == [] and cfg.params_for("cispo").eps_clip == 0.3  # the block it composes


def test_contract():
    from relax_authoring.testing import check_contract

    check_contract(_spec())
