"""relax-grpo: registration, advantages (values pinned by issue 3), PPO-clip loss, gradients,
dtypes, edge cases, startup validation."""

import math

import pytest
import torch

from relax_core.config import RunConfig, build_config
from relax_core.contracts import AdvantageInput, PolicyLossInput
from relax_core.host.plugins import default_registry
from relax_core.host.validation import resolve

NAN = float("nan")


def _spec():
    return default_registry().get("estimator", "grpo").spec


def _build(cfg=None, **params):
    spec = _spec()
    p = spec.params(**params)
    return spec.build(p, cfg or RunConfig())


def _adv_in(rewards, T=3, groups=None, lengths=None):
    B = len(rewards)
    lengths = [T] * B if lengths is None else lengths
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    g = torch.zeros(B, dtype=torch.long) if groups is None else torch.tensor(groups)
    return AdvantageInput(rewards=torch.tensor(rewards, dtype=torch.float32), group_index=g, loss_mask=mask)


def _seq_adv(out):
    return out.advantages[:, 0]


def test_registered_with_capabilities():
    spec = _spec()
    caps = spec.capabilities_for()
    assert spec.factory == "relax_grpo.grpo:build"
    assert caps.min_group_size == 2 and caps.behaviour_numerator == "old_log_probs" and "kl_coef" not in caps.uses_options
    assert spec.capabilities_for(spec.params(pg_loss_type="reinforce")).behaviour_numerator == "log_probs"


def test_advantage_values_from_issue():
    est = _build()
    out = est.compute_advantages(_adv_in([1, 0, 0, 0]))
    torch.testing.assert_close(_seq_adv(out), torch.tensor([1.499997, -0.499999, -0.499999, -0.499999]), atol=1e-6, rtol=0)
    assert (out.advantages == out.advantages[:, :1]).all()
    out = est.compute_advantages(_adv_in([1, 1, 1, 0, 0, 0, 0, 0]))
    assert _seq_adv(out)[0].item() == pytest.approx(1.207612, abs=1e-6)
    assert _seq_adv(out)[7].item() == pytest.approx(-0.724567, abs=1e-6)
    out = est.compute_advantages(_adv_in([1, NAN, 0, 0]))
    torch.testing.assert_close(_seq_adv(out), torch.tensor([1.154699, 0.0, -0.577349, -0.577349]), atol=1e-6, rtol=0)
    out = _build(disable_grpo_std_normalization=True).compute_advantages(_adv_in([1, 0, 0, 0]))
    torch.testing.assert_close(_seq_adv(out), torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_advantages_broadcast_masked_and_returns_copy():
    est = _build()
    out = est.compute_advantages(_adv_in([1, 0, 2, 2, 2, 2], T=3, groups=[0, 0, 1, 1, 1, 1], lengths=[3, 0, 2, 3, 1, 3]))
    # group 0: [1, 0] → ±1/(√0.5 + 1e-6); the empty response still enters the baseline
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(out.advantages[0], torch.full((3,), a))
    assert (out.advantages[1] == 0).all()  # empty response: no tokens
    assert (out.advantages[2:] == 0).all()  # all-equal group: exactly 0
    assert out.metrics["rollout/zero_std_group_frac"] == 0.5
    torch.testing.assert_close(out.returns, out.advantages)
    assert out.returns.data_ptr() != out.advantages.data_ptr()


def test_disable_rewards_normalization_uses_raw_rewards():
    est = _build(RunConfig(disable_rewards_normalization=True))
    out = est.compute_advantages(_adv_in([1.5, NAN, -2.0], T=2))
    torch.testing.assert_close(out.advantages, torch.tensor([[1.5, 1.5], [0.0, 0.0], [-2.0, -2.0]]))


def _loss_in(ratio, A, old=-1.0, mask=None, dtype=torch.float32):
    r = torch.tensor(ratio, dtype=torch.float64)
    lp = (torch.log(r) + old).to(dtype).requires_grad_(True)
    m = torch.ones(r.shape, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return PolicyLossInput(log_probs=lp, old_log_probs=torch.full(r.shape, old, dtype=dtype),
                           advantages=torch.tensor(A, dtype=dtype), loss_mask=m)


def test_ppo_clip_values_and_clipfrac():
    inp = _loss_in([[0.5, 0.5, 1.5, 1.5]], [[1.0, -1.0, -1.0, 1.0]])
    out = _build().policy_loss(inp)
    torch.testing.assert_close(out.loss, torch.tensor([[-0.5, 0.8, 1.5, -1.2]]))
    assert out.token_metrics["pg_clipfrac"].mean().item() == 0.5
    out.loss.sum().backward()
    torch.testing.assert_close(inp.log_probs.grad, torch.tensor([[-0.5, 0.0, 1.5, 0.0]]))


def test_eps_clip_high_and_dual_clip_come_from_the_clip_block():
    inp = _loss_in([[1.5, 4.0]], [[1.0, -1.0]])
    out = _build(eps_clip=0.2, eps_clip_high=0.28, eps_clip_c=3.0).policy_loss(inp)
    torch.testing.assert_close(out.loss, torch.tensor([[-1.28, 3.0]]))
    out = _build(eps_clip=0.1).policy_loss(inp)  # eps_clip_high defaults to eps_clip
    torch.testing.assert_close(out.loss, torch.tensor([[-1.1, 4.0]]))


def test_reinforce_option_is_unclipped():
    inp = _loss_in([[1.5, 0.5]], [[1.0, -2.0]], old=-1.0)
    out = _build(pg_loss_type="reinforce").policy_loss(inp)
    lp = inp.log_probs.detach()
    torch.testing.assert_close(out.loss, -torch.tensor([[1.0, -2.0]]) * lp)
    out.loss.sum().backward()
    torch.testing.assert_close(inp.log_probs.grad, torch.tensor([[-1.0, 2.0]]))
    assert out.token_metrics["pg_clipfrac"].sum() == 0


def test_gradient_matches_formula_random():
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(5, 7, generator=g) * 2
    lp = (old + 0.5 * torch.randn(5, 7, generator=g)).requires_grad_(True)
    A = torch.randn(5, 7, generator=g)
    m = torch.rand(5, 7, generator=g) > 0.25
    m[2] = False  # all-masked sample
    out = _build().policy_loss(PolicyLossInput(log_probs=lp, old_log_probs=old, advantages=A, loss_mask=m))
    out.loss.sum().backward()
    r = torch.exp(lp.detach() - old)
    free = ((A >= 0) & (r <= 1.2)) | ((A < 0) & (r >= 0.8))
    torch.testing.assert_close(lp.grad, torch.where(m & free, -A * r, torch.zeros(())))
    assert (out.loss[2] == 0).all() and (lp.grad[2] == 0).all()


def test_masked_garbage_is_inert_and_bfloat16_runs():
    m = torch.tensor([[True, True, False]])
    res = []
    for bad in (NAN, 1e9):
        lp = torch.tensor([[-1.0, -0.5, bad]], requires_grad=True)
        inp = PolicyLossInput(log_probs=lp, old_log_probs=torch.tensor([[-1.2, -0.4, bad]]),
                              advantages=torch.tensor([[0.7, -0.3, bad]]), loss_mask=m)
        out = _build().policy_loss(inp)
        out.loss.sum().backward()
        res.append((out.loss.detach(), lp.grad))
    torch.testing.assert_close(res[0][0], res[1][0])
    torch.testing.assert_close(res[0][1], res[1][1])
    inp16 = _loss_in([[0.9, 1.1, 1.3]], [[1.0, -1.0, 1.0]], dtype=torch.bfloat16)
    out16 = _build().policy_loss(inp16)
    out16.loss.sum().backward()
    assert out16.loss.dtype == torch.float32 and inp16.log_probs.grad.dtype == torch.bfloat16
    ref = _build().policy_loss(_loss_in([[0.9, 1.1, 1.3]], [[1.0, -1.0, 1.0]]))
    torch.testing.assert_close(out16.loss, ref.loss, atol=2e-2, rtol=2e-2)


def _problems(**cli):
    reg = default_registry()
    cfg = build_config(cli=cli, param_schemas=reg.param_schemas())
    _, problems = resolve(cfg, reg)
    return [p for p in problems if p.component.startswith("estimator")]


def test_startup_refuses_kl_coef_and_groups_of_one():
    probs = _problems(advantage_estimator="grpo", kl_coef=0.1)
    assert [p.constraint for p in probs] == ["uses_options"]
    assert "relax-grpo" in probs[0].component and "--use-kl-loss" in probs[0].fix
    assert [p.constraint for p in _problems(advantage_estimator="grpo", eps_clip=0.3)] == []
    [p] = _problems(advantage_estimator="grpo", eps_clip=0.3, **{"grpo.pg_loss_type": "reinforce"})  # no clip
    assert (p.constraint, p.message, p.fix) == (
        "parameters", "grpo: --pg-loss-type reinforce does not read --eps-clip 0.3: set, it would be a silent no-op",
        "drop those flags, or use --pg-loss-type ppo_clip")
    probs = _problems(advantage_estimator="grpo", n_samples_per_prompt=1)
    assert [p.constraint for p in probs] == ["min_group_size"]
    assert _problems(advantage_estimator="grpo") == []


def test_contract():
    from relax_authoring.testing import check_contract

    check_contract(_spec())


def test_contract_reinforce_option():
    from relax_authoring.testing import check_contract

    check_contract(_spec(), _spec().params(pg_loss_type="reinforce"))
