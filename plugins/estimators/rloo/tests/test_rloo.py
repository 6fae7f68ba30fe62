"""relax-rloo: leave-one-out advantages (values pinned by issue 3), REINFORCE loss and its
gradient, diagnostics, capabilities and startup refusals."""

import pytest
import torch

from relax_core.config import RunConfig, build_config
from relax_core.contracts import AdvantageInput, PolicyLossInput
from relax_core.host.plugins import default_registry
from relax_core.host.validation import resolve

NAN = float("nan")


def _spec():
    return default_registry().get("estimator", "rloo").spec


def _build(cfg=None):
    return _spec().build(None, cfg or RunConfig(n_samples_per_prompt=4))


def _adv_in(rewards, lengths, groups=None, T=3):
    B = len(rewards)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    g = torch.zeros(B, dtype=torch.long) if groups is None else torch.tensor(groups)
    return AdvantageInput(rewards=torch.tensor(rewards, dtype=torch.float32), group_index=g, loss_mask=mask,
                          response_lengths=torch.tensor(lengths))


def test_values_from_issue():
    out = _build(RunConfig(n_samples_per_prompt=8)).compute_advantages(_adv_in([1, 1, 1, 0, 0, 0, 0, 0], [3] * 8))
    assert out.advantages[0, 0].item() == pytest.approx(0.714286, abs=1e-6)
    assert out.advantages[7, 0].item() == pytest.approx(-0.428571, abs=1e-6)
    out = _build().compute_advantages(_adv_in([1, 0, 0, 0], [3] * 4))
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    out = _build().compute_advantages(_adv_in([1, NAN, 0, 0], [3] * 4))
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor([1.0, 0.0, -0.5, -0.5]))
    torch.testing.assert_close(out.returns, out.advantages)


def test_empty_response_feeds_the_baseline_and_gets_no_tokens():
    out = _build().compute_advantages(_adv_in([1, 0, 0, 1], [2, 0, 3, 1]))
    # A = 4/3·(R − 0.5) = ±2/3; the empty sample's row is 0 everywhere
    torch.testing.assert_close(out.advantages, torch.tensor([[2 / 3, 2 / 3, 0], [0, 0, 0], [-2 / 3] * 3, [2 / 3, 0, 0]]))


def test_diagnostics_hand_computed():
    rewards = [1, 0, 0, 0, 1, 1, 1, 1, 1, 0, 1]
    lengths = [2, 0, 3, 1, 2, 2, 2, 2, 3, 3, 3]
    groups = [0, 0, 0, 0, 5, 5, 5, 5, 9, 9, 9]  # group 9 has 3 of 4 samples: incomplete
    m = _build().compute_advantages(_adv_in(rewards, lengths, groups)).metrics
    assert m["rollout/rloo/baseline_mean"] == pytest.approx(0.625)  # (0 + 3·1/3 + 4·1)/8
    assert m["rollout/rloo/adv_abs_mean"] == pytest.approx(0.25)  # (1 + 3·1/3)/8
    assert m["rollout/rloo/no_signal_frac"] == pytest.approx(8 / 14)
    assert m["rollout/rloo/empty_response_frac"] == pytest.approx(1 / 8)
    assert m["rollout/rloo/zero_adv_group_frac"] == pytest.approx(0.5)
    assert m["rollout/rloo/dropped_group_frac"] == pytest.approx(1 / 3)
    assert m["rollout/zero_std_group_frac"] == pytest.approx(1 / 3)


def test_diagnostics_omitted_when_post_processor_replaces_signal():
    est = _build(RunConfig(n_samples_per_prompt=4, reward_processor=("not_installed_processor",)))
    m = est.compute_advantages(_adv_in([1, 0, 0, 0], [3] * 4)).metrics
    assert not any(k.startswith("rollout/rloo/") for k in m)


def test_loss_is_minus_a_log_pi_with_gradient_minus_a():
    lp = torch.tensor([[-2.0, -1.0, 9.0], [-0.5, float("nan"), float("nan")]], requires_grad=True)
    A = torch.tensor([[1.0, 1.0, 1.0], [-1 / 3, 0.0, 0.0]])
    m = torch.tensor([[True, True, False], [True, False, False]])
    out = _build().policy_loss(PolicyLossInput(log_probs=lp, old_log_probs=torch.full((2, 3), -1.0), advantages=A, loss_mask=m))
    torch.testing.assert_close(out.loss, torch.tensor([[2.0, 1.0, 0.0], [-0.5 / 3, 0.0, 0.0]]))
    out.loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-1.0, -1.0, 0.0], [1 / 3, 0.0, 0.0]]))
    assert out.token_metrics["pg_clipfrac"].sum() == 0
    # token mean over the global valid tokens (the reduction RLOO requires)
    from relax_core.numerics import reduce_loss
    assert reduce_loss(out.loss, m, "token-mean").item() == pytest.approx((2.0 + 1.0 - 0.5 / 3) / 3)


def test_bfloat16_gradient():
    lp = torch.tensor([[-2.0, -1.0]], dtype=torch.bfloat16, requires_grad=True)
    out = _build().policy_loss(PolicyLossInput(log_probs=lp, old_log_probs=lp.detach(),
                                               advantages=torch.tensor([[0.75, 0.75]], dtype=torch.bfloat16),
                                               loss_mask=torch.ones(1, 2, dtype=torch.bool)))
    out.loss.sum().backward()
    assert lp.grad.dtype == torch.bfloat16 and lp.grad.tolist() == [[-0.75, -0.75]]


def test_capabilities_match_the_constraint_table():
    c = _spec().capabilities_for()
    assert c.sync_only and not c.supports_fully_async and c.min_group_size == 2
    assert c.requires_per_token_loss and c.requires_rewards_normalization and c.forbids_normalize_advantages
    assert not c.uses_options and c.behaviour_numerator == "log_probs" and c.requires_complete_groups


def _problems(**cli):
    reg = default_registry()
    cli = {"advantage_estimator": "rloo", "calculate_per_token_loss": True, **cli}
    cfg = build_config(cli=cli, param_schemas=reg.param_schemas())
    return [p for p in resolve(cfg, reg)[1] if p.component.startswith("estimator")]


def test_startup_refusals():
    assert _problems() == []
    probs = _problems(max_staleness=1, fully_async=True, launcher="ray")
    assert sorted(p.constraint for p in probs) == ["supports_fully_async", "sync_only"]
    probs = [p for p in probs if p.constraint == "sync_only"]
    assert "relax-rloo" in probs[0].component and "--max-staleness 0" in probs[0].fix
    assert "--fully-async" in probs[0].message and "--max-staleness 1" in probs[0].message
    cases = {"min_group_size": dict(n_samples_per_prompt=1, rollout_batch_size=32),
             "requires_per_token_loss": dict(calculate_per_token_loss=False),
             "uses_options": dict(kl_coef=0.1),
             "forbids_normalize_advantages": dict(normalize_advantages=True),
             "requires_rewards_normalization": dict(disable_rewards_normalization=True)}
    for constraint, kw in cases.items():
        assert constraint in [p.constraint for p in _problems(**kw)], constraint
    # KL loss with a reference model is allowed
    assert _problems(use_kl_loss=True, kl_loss_coef=0.01) == []
    # one update per rollout: global batch must equal rollout_batch_size × n
    assert [p.constraint for p in _problems(global_batch_size=16)] == ["sync_only"]


def test_contract():
    from relax_authoring.testing import check_contract

    check_contract(_spec())


def test_declared_metrics_are_the_ones_reported():
    m = _build().compute_advantages(_adv_in([1, 0, 0, 0], [3] * 4)).metrics
    assert {k for k in m if k.startswith("rollout/rloo/")} == set(_spec().capabilities_for().metrics)
