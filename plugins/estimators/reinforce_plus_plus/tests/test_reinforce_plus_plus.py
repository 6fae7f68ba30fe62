"""relax-reinforce-plus-plus: shaped returns (issue values), masking and garbage, the global
token normalisation (one process and 2 gloo ranks), PPO-clip loss and gradient, spec, CLI."""

import sys
from pathlib import Path

import pytest
import torch

from relax_core.config import build_config, parse_cli
from relax_core.contracts import AdvantageInput, PolicyLossInput
from relax_reinforce_plus_plus.plugin import CAPABILITIES, ReinforcePlusPlusParams, relax_register_estimators
from relax_reinforce_plus_plus.reinforce_plus_plus import shaped_returns

SPEC = relax_register_estimators()[0]
NAN = float("nan")


def _build(*flags):
    cli, _, _ = parse_cli(list(flags), {"reinforce_plus_plus": ReinforcePlusPlusParams})
    cfg = build_config(cli=cli, param_schemas={"reinforce_plus_plus": ReinforcePlusPlusParams})
    return SPEC.build(cfg.params_for("reinforce_plus_plus"), cfg)


def _sequential_returns(rewards, kl, mask, beta, gamma):
    """Per-token loop of the specification: reward on the last valid token, −β·kl on valid
    tokens, discount over every position, zero at masked positions."""
    B, T = mask.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        valid = [t for t in range(T) if mask[i, t]]
        acc = 0.0
        for t in reversed(range(T)):
            r = (-beta * float(kl[i, t]) if mask[i, t] else 0.0) + (float(rewards[i]) if valid and t == valid[-1] else 0.0)
            acc = r + gamma * acc
            out[i, t] = acc if mask[i, t] else 0.0
    return out


# --------------------------------------------------------------------------- returns


def test_issue_values_undiscounted():
    rewards = torch.tensor([1.5, -0.25, 2.0])
    kl = torch.tensor([[0.2, 0, 0, 0, 0], [0.1, 9999, -0.3, 0, 0], [0.2, -0.4, 0.7, -8888, 0.5]])
    mask = torch.tensor([[1, 0, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 1, 0, 1]], dtype=torch.bool)
    G = shaped_returns(rewards, kl, mask, kl_coef=0.2, gamma=1.0)
    expected = torch.tensor([[1.46, 0, 0, 0, 0], [-0.21, 0, -0.19, 0, 0], [1.80, 1.84, 1.76, 0, 1.90]])
    torch.testing.assert_close(G, expected)


def test_issue_value_discounted_hole_keeps_the_discount():
    G = shaped_returns(torch.tensor([1.0]), torch.tensor([[0.5, 12345, -0.25]]),
                       torch.tensor([[1, 0, 1]], dtype=torch.bool), kl_coef=0.1, gamma=0.5)
    # r = [−0.05, 0 (hole), 0.025 + 1]; G2 = 1.025, G1 = 0.5125 (zeroed), G0 = −0.05 + 0.5·0.5125
    torch.testing.assert_close(G, torch.tensor([[0.20625, 0.0, 1.025]]))


@pytest.mark.parametrize("gamma", [1.0, 0.97, 0.5, 0.0])
def test_returns_equal_sequential_reference(gamma):
    g = torch.Generator().manual_seed(5)
    B, T = 4, 260
    mask = torch.rand(B, T, generator=g) < 0.8
    mask[1, 100:] = False
    mask[3] = False
    kl = torch.randn(B, T, generator=g)
    rewards = torch.randn(B, generator=g)
    G = shaped_returns(rewards, kl, mask, 0.05, gamma)
    torch.testing.assert_close(G.double(), _sequential_returns(rewards, kl, mask, 0.05, gamma), atol=1e-6, rtol=0)
    assert G.dtype == torch.float32 and G[3].abs().sum() == 0


def _sequential_returns_f64(rewards, kl, mask, beta, gamma):
    """:func:`_sequential_returns` on numpy float64 (fast enough for T = 8192)."""
    import numpy as np

    m = mask.numpy()
    r = np.where(m, -beta * kl.double().numpy(), 0.0)
    for i in range(m.shape[0]):
        if m[i].any():
            r[i, np.flatnonzero(m[i])[-1]] += float(rewards[i])
    out, acc = np.zeros(r.shape), np.zeros(r.shape[0])
    for t in reversed(range(r.shape[1])):
        acc = r[:, t] + gamma * acc
        out[:, t] = acc
    return torch.from_numpy(np.where(m, out, 0.0))


@pytest.mark.parametrize("gamma", [1.0, 0.99])
def test_returns_long_sequences_float32_accuracy(gamma):
    g = torch.Generator().manual_seed(8)
    B, T = 3, 8192
    mask = torch.arange(T)[None, :] < torch.tensor([[T], [T - 1000], [5000]])
    mask[0, 100:200] = False  # a hole: the discount runs through it
    kl = torch.randn(B, T, generator=g) * 0.5
    rewards = torch.tensor([1.0, 0.0, -1.0])
    G = shaped_returns(rewards, kl, mask, 0.05, gamma)
    ref = _sequential_returns_f64(rewards, kl, mask, 0.05, gamma)
    # a few float32 ulps of the largest partial sum of the shaped rewards
    scale = float(ref.abs().max() + (0.05 * kl.double() * mask).cumsum(-1).abs().max())
    assert float((G.double() - ref).abs().max()) <= 16 * torch.finfo(torch.float32).eps * max(scale, 1.0)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_returns_garbage_empty_rows_and_shapes(gamma):
    g = torch.Generator().manual_seed(9)
    mask = torch.rand(4, 70, generator=g) < 0.7
    mask[1] = False
    kl, rewards = torch.randn(4, 70, generator=g), torch.randn(4, generator=g)
    rewards[1] = NAN  # an empty row may carry anything
    clean = shaped_returns(rewards, kl, mask, 0.1, gamma)
    assert torch.isfinite(clean).all() and (clean[1] == 0).all()
    torch.testing.assert_close(clean.double(), _sequential_returns_f64(rewards, kl, mask, 0.1, gamma), atol=1e-6, rtol=1e-6)
    for junk in (NAN, 1e9, -float("inf")):
        assert torch.equal(shaped_returns(rewards, torch.where(mask, kl, junk), mask, 0.1, gamma), clean)
    assert shaped_returns(torch.zeros(0), torch.zeros(0, 3), torch.zeros(0, 3, dtype=torch.bool), 0.1, gamma).shape == (0, 3)
    assert shaped_returns(torch.ones(2), torch.zeros(2, 0), torch.zeros(2, 0, dtype=torch.bool), 0.1, gamma).shape == (2, 0)


# --------------------------------------------------------------------------- advantages


def test_compute_advantages_normalises_globally_and_skips_unscored_and_garbage():
    est = _build("--kl-coef", "0.2", "--gamma", "1.0")
    mask = torch.tensor([[1, 0, 0], [1, 0, 1], [1, 1, 0]], dtype=torch.bool)
    ref = torch.zeros(3, 3)
    old = torch.tensor([[0.2, NAN, NAN], [0.1, 1e9, -0.3], [0.0, 0.0, NAN]])  # k1 = old − ref
    out = est.compute_advantages(AdvantageInput(
        rewards=torch.tensor([1.5, -0.25, NAN]), group_index=torch.arange(3), loss_mask=mask,
        old_log_probs=old, ref_log_probs=ref))
    # G = [1.46], [−0.21, ·, −0.19]; row 2 unscored: left out.  μ = 1.06/3, σ² over the 3 tokens
    g = torch.tensor([1.46, -0.21, -0.19], dtype=torch.float64)
    mu, sd = g.mean(), g.var(unbiased=False).sqrt()
    a = ((g - mu) / sd).float()
    torch.testing.assert_close(out.advantages, torch.tensor([[a[0], 0, 0], [a[1], 0, a[2]], [0, 0, 0]]))
    torch.testing.assert_close(out.returns, torch.tensor([[1.46, 0, 0], [-0.21, 0, -0.19], [0, 0, 0]]))
    assert out.normalized
    assert out.metrics["rollout/return_mean"] == pytest.approx(float(mu), abs=1e-6)
    assert out.metrics["rollout/return_std"] == pytest.approx(float(sd), abs=1e-6)
    assert out.metrics["rollout/reward_kl"] == pytest.approx(0.0, abs=1e-7)  # (0.2 + 0.1 − 0.3)/3
    assert torch.isfinite(out.advantages).all()


def test_compute_advantages_bfloat16_log_probs_and_errors():
    est = _build("--kl-coef", "0.1")
    mask = torch.ones(2, 2, dtype=torch.bool)
    base = dict(rewards=torch.tensor([1.0, 0.0]), group_index=torch.arange(2), loss_mask=mask)
    lp = torch.tensor([[-1.0, -0.5], [-2.0, -0.25]])
    o32 = est.compute_advantages(AdvantageInput(**base, old_log_probs=lp, ref_log_probs=lp - 0.5))
    obf = est.compute_advantages(AdvantageInput(**base, old_log_probs=lp.bfloat16(),
                                                ref_log_probs=(lp - 0.5).bfloat16()))
    assert obf.advantages.dtype == torch.float32
    torch.testing.assert_close(obf.advantages, o32.advantages)  # values exact in bfloat16
    with pytest.raises(ValueError, match="ref_log_probs"):
        est.compute_advantages(AdvantageInput(**base, old_log_probs=lp))
    with pytest.raises(ValueError, match="empty on every rank"):
        est.compute_advantages(AdvantageInput(rewards=torch.tensor([NAN]), group_index=torch.zeros(1, dtype=torch.long),
                                              loss_mask=torch.ones(1, 2, dtype=torch.bool),
                                              old_log_probs=torch.zeros(1, 2), ref_log_probs=torch.zeros(1, 2)))


def test_two_gloo_ranks_equal_one_process(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    import rpp_dist

    r0, r1 = rpp_dist.spawn(2, str(tmp_path))
    whole = rpp_dist.build().compute_advantages(AdvantageInput(**rpp_dist.whole_batch()))
    torch.testing.assert_close(torch.cat([r0["advantages"], r1["advantages"]]), whole.advantages, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(torch.cat([r0["returns"], r1["returns"]]), whole.returns)
    for r in (r0, r1):
        assert r["metrics"]["rollout/return_mean"] == pytest.approx(whole.metrics["rollout/return_mean"], abs=1e-6)
        assert "empty on every rank" in r["global_empty"]
    assert r0["advantages"][2].abs().sum() == 0  # the empty response
    whole = rpp_dist.build().compute_advantages(AdvantageInput(**rpp_dist.batch_with_empty_rank()))
    assert whole.advantages[3:].abs().sum() == 0 and whole.advantages[:3].abs().sum() > 0
    torch.testing.assert_close(torch.cat([r0["empty_rank_advantages"], r1["empty_rank_advantages"]]),
                               whole.advantages, atol=1e-6, rtol=1e-6)


# --------------------------------------------------------------------------- policy loss


def test_policy_loss_ppo_clip_and_gradient():
    est = _build("--kl-coef", "0.01", "--eps-clip", "0.2")
    ratio = torch.tensor([[0.9, 1.5, 0.5, 1.0]], dtype=torch.float64)
    lp = (torch.log(ratio) - 2.0).float().requires_grad_(True)
    A = torch.tensor([[1.0, 1.0, -1.0, 2.0]])
    mask = torch.tensor([[True, True, True, False]])
    out = est.policy_loss(PolicyLossInput(log_probs=lp, old_log_probs=torch.full((1, 4), -2.0), advantages=A,
                                          loss_mask=mask))
    # −rA unclipped at 0.9; clipped at 1.5 (A > 0) → −1.2; 0.5 with A < 0 → max(0.5, 0.8) = 0.8; masked → 0
    torch.testing.assert_close(out.loss, torch.tensor([[-0.9, -1.2, 0.8, 0.0]]))
    out.loss.sum().backward()
    # d/d log π = −A·r on the unclipped branch, 0 where the clip binds or masked
    torch.testing.assert_close(lp.grad, torch.tensor([[-0.9, 0.0, 0.0, 0.0]]))
    assert out.token_metrics["pg_clipfrac"].tolist() == [[0.0, 1.0, 1.0, 0.0]]


# --------------------------------------------------------------------------- spec and CLI


def test_capabilities_declared():
    c = CAPABILITIES
    assert c.requires_normalize_advantages and c.forbids_per_token_loss and not c.supports_context_parallel
    assert c.sync_only and not c.supports_fully_async
    assert "kl_coef" in c.uses_options and c.requires_reward_side_kl and c.required_kl_loss_type == "k1" and c.forbids_kl_loss
    assert c.behaviour_numerator == "old_log_probs"
    e = _build("--kl-coef", "0.01", "--gamma", "0.99", "--eps-clip-high", "0.28")
    assert (e.kl_coef, e.gamma, e.eps_clip, e.eps_clip_high) == (0.01, 0.99, 0.2, 0.28)
    assert SPEC.build(ReinforcePlusPlusParams(), None).gamma == 1.0


def test_cli_refuses_without_normalize_advantages_naming_capability_and_fix():
    from typer.testing import CliRunner

    from cli.main import app

    res = CliRunner().invoke(app, ["train", "--dry-run", "--advantage-estimator", "reinforce_plus_plus",
                                   "--kl-coef", "0.01"])
    assert res.exit_code == 2
    assert "estimator 'reinforce_plus_plus'" in res.output and "[requires_normalize_advantages]" in res.output
    assert "fix: add --normalize-advantages" in res.output
    res = CliRunner().invoke(app, ["train", "--dry-run", "--advantage-estimator", "reinforce_plus_plus",
                                   "--normalize-advantages", "--calculate-per-token-loss", "--use-kl-loss",
                                   "--kl-loss-coef", "0.01"])
    assert res.exit_code == 2
    for cap in ("[requires_reward_side_kl]", "[forbids_per_token_loss]", "[forbids_kl_loss]"):
        assert cap in res.output


def test_contract():
    from relax_authoring.testing import check_contract

    check_contract(SPEC)
