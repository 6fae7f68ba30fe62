"""relax-gspo: sequence-level ratio (values pinned by issue 3), padding inertness, gradient
vs formula, clipping, dtypes, capabilities."""


import pytest
import torch

from relax_core.config import RunConfig, build_config
from relax_core.contracts import AdvantageInput, PolicyLossInput
from relax_core.host.plugins import default_registry
from relax_core.host.validation import resolve


def _spec():
    return default_registry().get("estimator", "gspo").spec


def _build(cfg=None, **params):
    spec = _spec()
    return spec.build(spec.params(**params), cfg or RunConfig())


def _issue_case(pad_value, A=-1.0):
    old = torch.tensor([[-1.0, -2.0, -0.5]])
    lp = (old + torch.tensor([[0.1, -0.3, pad_value]])).requires_grad_(True)
    m = torch.tensor([[True, True, False]])
    return PolicyLossInput(log_probs=lp, old_log_probs=old, advantages=torch.full((1, 3), A), loss_mask=m)


def test_sequence_ratio_and_its_gradient_from_issue():
    grads = []
    for pad in (5.0, -40.0, float("nan")):
        inp = _issue_case(pad)
        out = _build().policy_loss(inp)
        # A = −1, s = 0.904837 inside [0.8, 1.2]: L = s on both valid tokens
        torch.testing.assert_close(out.loss, torch.tensor([[0.904837, 0.904837, 0.0]]))
        torch.testing.assert_close(out.token_metrics["ppo_kl"], torch.tensor([[0.1, 0.1, 0.0]]))
        (out.loss[0, 0]).backward()  # one token's loss = s: its gradient is d s / d log π
        torch.testing.assert_close(inp.log_probs.grad, torch.tensor([[0.452419, 0.452419, 0.0]]))
        grads.append(inp.log_probs.grad)
    assert all(torch.equal(g, grads[0]) for g in grads)


def test_gradient_matches_formula_random():
    g = torch.Generator().manual_seed(2)
    B, T = 6, 5
    old = -torch.rand(B, T, generator=g) * 2
    lp = (old + 0.3 * torch.randn(B, T, generator=g)).requires_grad_(True)
    A = torch.randn(B, generator=g)[:, None].expand(B, T).contiguous()
    m = torch.arange(T)[None, :] < torch.tensor([5, 3, 0, 1, 4, 2])[:, None]  # sample 2 empty
    out = _build(eps_clip=0.1, eps_clip_high=0.15).policy_loss(PolicyLossInput(log_probs=lp, old_log_probs=old, advantages=A, loss_mask=m))
    out.loss.sum().backward()
    n = m.sum(-1).clamp(min=1)
    s = torch.exp(torch.where(m, lp.detach() - old, 0.0).sum(-1) / n)  # [B]
    a = A[:, 0]
    free = ((a >= 0) & (s <= 1.15)) | ((a < 0) & (s >= 0.9))
    expect = torch.where(m, (-a * s * free)[:, None].expand(B, T), 0.0)  # n_i tokens × (s/n_i) each
    torch.testing.assert_close(lp.grad, expect)
    assert (out.loss[2] == 0).all()
    clipped = out.token_metrics["pg_clipfrac"]
    torch.testing.assert_close(clipped, torch.where(m, (~free & (a != 0)).float()[:, None].expand(B, T), 0.0))


def test_bfloat16_runs():
    inp = _issue_case(5.0)
    inp16 = PolicyLossInput(log_probs=inp.log_probs.detach().bfloat16().requires_grad_(True),
                            old_log_probs=inp.old_log_probs.bfloat16(), advantages=inp.advantages.bfloat16(),
                            loss_mask=inp.loss_mask)
    out = _build().policy_loss(inp16)
    out.loss.sum().backward()
    assert out.loss.dtype == torch.float32 and inp16.log_probs.grad.dtype == torch.bfloat16
    assert out.loss[0, 0].item() == pytest.approx(0.904837, abs=2e-2)


def test_advantages_as_grpo():
    inp = AdvantageInput(rewards=torch.tensor([1.0, float("nan"), 0.0, 0.0]), group_index=torch.tensor([3, 3, 3, 3]),
                         loss_mask=torch.ones(4, 2, dtype=torch.bool))
    out = _build().compute_advantages(inp)
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor([1.154699, 0.0, -0.577349, -0.577349]), atol=1e-6, rtol=0)


def test_capabilities_and_cp_refusal():
    c = _spec().capabilities_for()
    assert c.kl_level == "sequence" and c.needs_full_sequence and c.forbids_per_token_loss
    assert not c.supports_context_parallel and c.behaviour_numerator == "old_log_probs"
    reg = default_registry()
    cfg = build_config(cli={"advantage_estimator": "gspo", "context_parallel_size": 2, "calculate_per_token_loss": True},
                       param_schemas=reg.param_schemas())
    est = {p.constraint for p in resolve(cfg, reg)[1] if p.component.startswith("estimator")}
    assert est == {"supports_context_parallel", "forbids_per_token_loss"}


def test_contract():
    from relax_authoring.testing import check_contract

    check_contract(_spec())
