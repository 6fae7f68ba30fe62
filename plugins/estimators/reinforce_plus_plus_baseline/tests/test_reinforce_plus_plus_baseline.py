"""relax-reinforce-plus-plus-baseline: inclusive group mean, token-weighted global
normalisation (issue value, one process and 2 gloo ranks), unscored samples, PPO-clip,
spec and CLI."""

import math
import sys
from pathlib import Path

import pytest
import torch

from relax_core.contracts import AdvantageInput, PolicyLossInput
from relax_reinforce_plus_plus_baseline.plugin import CAPABILITIES, relax_register_estimators

SPEC = relax_register_estimators()[0]
EST = SPEC.build(None, None)
NAN = float("nan")


def _lengths_mask(lengths, t):
    return torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]


def test_issue_value_token_weighted_normalisation():
    mask = _lengths_mask([1, 3, 2, 2], 3)
    out = EST.compute_advantages(AdvantageInput(rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]),
                                                group_index=torch.tensor([0, 0, 1, 1]), loss_mask=mask))
    # C = [0.5, −0.5, 0, 0] over 1, 3, 2, 2 tokens: μ = −0.125, σ² = 0.109375
    a, b, c = 1.889822, -1.133893, 0.377964
    expected = torch.tensor([[a, 0, 0], [b, b, b], [c, c, 0], [c, c, 0]])
    torch.testing.assert_close(out.advantages, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.returns, torch.tensor([[0.5, 0, 0], [-0.5, -0.5, -0.5], [0, 0, 0], [0, 0, 0]]))
    assert out.normalized
    assert out.metrics["rollout/zero_std_group_frac"] == 0.5
    assert out.metrics["rollout/advantage_raw_std"] == pytest.approx(math.sqrt(0.109375))


def test_inclusive_group_mean_no_std_and_groups_by_index_not_position():
    mask = torch.ones(4, 1, dtype=torch.bool)
    out = EST.compute_advantages(AdvantageInput(rewards=torch.tensor([3.0, 0.0, 2.0, 1.0]),
                                                group_index=torch.tensor([7, 7, 7, 7]), loss_mask=mask))
    # C = [1.5, −1.5, 0.5, −0.5] (inclusive mean 1.5, not leave-one-out, no std)
    torch.testing.assert_close(out.returns, torch.tensor([[1.5], [-1.5], [0.5], [-0.5]]))
    # interleaved groups: {0: 1, 2: 0}, {1: 5, 3: 3}
    out = EST.compute_advantages(AdvantageInput(rewards=torch.tensor([1.0, 5.0, 0.0, 3.0]),
                                                group_index=torch.tensor([0, 1, 0, 1]), loss_mask=mask))
    torch.testing.assert_close(out.returns, torch.tensor([[0.5], [1.0], [-0.5], [-1.0]]))


def test_kl_inputs_are_ignored_and_unscored_sample_left_out():
    mask = _lengths_mask([2, 1, 2, 1], 2)
    base = dict(group_index=torch.tensor([0, 0, 0, 1]), loss_mask=mask)
    out = EST.compute_advantages(AdvantageInput(rewards=torch.tensor([2.0, 0.0, NAN, 4.0]), **base,
                                                old_log_probs=torch.full((4, 2), -1.0),
                                                ref_log_probs=torch.full((4, 2), -3.0)))
    # group 0 without the unscored sample: mean 1 → C = [1, −1]; group 1 single → 0
    torch.testing.assert_close(out.returns, torch.tensor([[1.0, 1.0], [-1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]))
    # tokens C = [1, 1, −1, 0]: μ = 0.25, σ² = 0.6875; unscored row stays 0
    sd = math.sqrt(0.6875)
    expected = torch.tensor([[0.75, 0.75], [-1.25, 0.0], [0.0, 0.0], [-0.25, 0.0]]) / sd
    torch.testing.assert_close(out.advantages, expected)


def test_all_equal_groups_and_errors():
    mask = torch.ones(4, 2, dtype=torch.bool)
    out = EST.compute_advantages(AdvantageInput(rewards=torch.tensor([1.0, 1.0, 0.0, 0.0]),
                                                group_index=torch.tensor([0, 0, 1, 1]), loss_mask=mask))
    assert out.advantages.abs().sum() == 0 and torch.isfinite(out.advantages).all()  # σ² = 0 → 0, never NaN
    assert out.metrics["rollout/zero_std_group_frac"] == 1.0
    with pytest.raises(ValueError, match="empty on every rank"):
        EST.compute_advantages(AdvantageInput(rewards=torch.tensor([1.0, 0.0]), group_index=torch.tensor([0, 0]),
                                              loss_mask=torch.zeros(2, 3, dtype=torch.bool)))


def test_two_gloo_ranks_equal_one_process(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    import rppb_dist

    r0, r1 = rppb_dist.spawn(2, str(tmp_path))
    whole = EST.compute_advantages(AdvantageInput(**rppb_dist.whole_batch()))
    torch.testing.assert_close(torch.cat([r0["advantages"], r1["advantages"]]), whole.advantages, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(torch.cat([r0["returns"], r1["returns"]]), whole.returns)
    for r in (r0, r1):
        assert r["metrics"]["rollout/advantage_raw_std"] == pytest.approx(whole.metrics["rollout/advantage_raw_std"])


def test_policy_loss_ppo_clip_dual_clip_and_bfloat16():
    est = SPEC.build(SPEC.params(eps_clip=0.2, eps_clip_c=3.0))
    ratio = torch.tensor([[1.1, 5.0]], dtype=torch.float64)
    lp = (torch.log(ratio) - 1.0).to(torch.bfloat16).requires_grad_(True)
    out = est.policy_loss(PolicyLossInput(log_probs=lp, old_log_probs=torch.full((1, 2), -1.0, dtype=torch.bfloat16),
                                          advantages=torch.tensor([[2.0, -1.0]]),
                                          loss_mask=torch.ones(1, 2, dtype=torch.bool)))
    assert out.loss.dtype == torch.float32
    r = torch.exp(lp.detach().float() + 1.0)  # the ratio bfloat16 log-probs give
    # −rA = −2r (inside the clip); A = −1 at r ≈ 5: max(5, 1.2) = 5 → dual clip min(5, 3) = 3
    torch.testing.assert_close(out.loss, torch.tensor([[-2 * r[0, 0].item(), 3.0]]))
    out.loss.sum().backward()
    assert lp.grad.dtype == torch.bfloat16
    torch.testing.assert_close(lp.grad.float(), torch.tensor([[-2 * r[0, 0].item(), 0.0]]), atol=2e-2, rtol=1e-2)


def test_capabilities_declared():
    c = CAPABILITIES
    assert c.min_group_size == 2 and c.requires_complete_groups
    assert "kl_coef" not in c.uses_options and c.requires_kl_loss and c.required_kl_loss_type == "k2"
    assert c.requires_normalize_advantages and c.requires_rewards_normalization and c.forbids_per_token_loss
    assert not c.allows_reward_post_processors and not c.supports_context_parallel and c.sync_only
    assert c.behaviour_numerator == "old_log_probs"


def test_cli_refuses_group_of_one_naming_capability_and_fix():
    from typer.testing import CliRunner

    from cli.main import app

    res = CliRunner().invoke(app, ["train", "--dry-run", "--advantage-estimator", "reinforce_plus_plus_baseline",
                                   "--n-samples-per-prompt", "1", "--normalize-advantages"])
    assert res.exit_code == 2
    out = res.output
    assert "estimator 'reinforce_plus_plus_baseline'" in out and "[min_group_size]" in out
    assert "fix: raise --n-samples-per-prompt" in out
    assert "[requires_kl_loss]" in out and "--use-kl-loss" in out
    res = CliRunner().invoke(app, ["train", "--dry-run", "--advantage-estimator", "reinforce_plus_plus_baseline",
                                   "--normalize-advantages", "--use-kl-loss", "--kl-loss-coef", "0.01",
                                   "--kl-loss-type", "k3", "--kl-coef", "0.1", "--disable-rewards-normalization"])
    assert res.exit_code == 2
    for cap in ("[required_kl_loss_type]", "[uses_options]", "[requires_rewards_normalization]"):
        assert cap in res.output


def test_contract():
    from relax_authoring.testing import check_contract

    check_contract(SPEC)
