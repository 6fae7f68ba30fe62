"""relax-ppo: GAE (pinned values, sequential reference, masking), clipped value loss
(values, gradient, clipfrac, garbage, dtypes), PPO-clip policy loss, spec and CLI."""

import pytest
import torch

from relax_core.config import build_config, parse_cli
from relax_core.contracts import AdvantageInput, PolicyLossInput, ValueLossInput
from relax_ppo.plugin import CAPABILITIES, PPOParams, relax_register_estimators
from relax_ppo.ppo import clipped_value_loss, gae, pack_valid

SPEC = relax_register_estimators()[0]


def _build(*flags):
    cli, _, _ = parse_cli(list(flags), {"ppo": PPOParams})
    cfg = build_config(cli=cli, param_schemas={"ppo": PPOParams})
    return SPEC.build(cfg.params_for("ppo"), cfg)


def _gae_sequential(rewards, values, mask, gamma, lambd):
    """Textbook per-token loop over the valid tokens of each row (the reference)."""
    B, T = mask.shape
    adv = torch.zeros(B, T, dtype=torch.float64)
    ret = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        idx = [t for t in range(T) if mask[i, t]]
        a_next, v_next = 0.0, 0.0
        for k, t in reversed(list(enumerate(idx))):
            r = float(rewards[i]) if k == len(idx) - 1 else 0.0
            v = float(values[i, t])
            delta = r + gamma * v_next - v
            a = delta + gamma * lambd * a_next
            adv[i, t], ret[i, t] = a, a + v
            a_next, v_next = a, v
    return adv, ret


# --------------------------------------------------------------------------- GAE


def test_gae_masked_hole_is_skipped_issue_value():
    mask = torch.tensor([[1, 1, 0, 0, 1]], dtype=torch.bool)
    adv, ret = gae(torch.tensor([1.0]), torch.zeros(1, 5), mask, gamma=0.9, lambd=1.0)
    # valid tokens t1, t2, t5 see the reward after 2, 1, 0 discounts: 0.81, 0.9, 1.0
    torch.testing.assert_close(adv, torch.tensor([[0.81, 0.9, 0.0, 0.0, 1.0]]))
    torch.testing.assert_close(ret, adv)  # V = 0


def test_gae_pad_value_is_never_read_issue_value():
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    values = torch.tensor([[0.5, 0.5, 5.0]])
    adv, ret = gae(torch.tensor([1.0]), values, mask, gamma=1.0, lambd=0.95)
    # δ2 = 1 + 0 − 0.5 = 0.5; δ1 = 0 + 0.5 − 0.5 = 0; Â1 = 0 + 0.95·0.5 = 0.475
    torch.testing.assert_close(adv, torch.tensor([[0.475, 0.5, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.975, 1.0, 0.0]]))


@pytest.mark.parametrize("gamma,lambd", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.0, 0.7), (0.5, 1.0)])
def test_gae_equals_sequential_reference(gamma, lambd):
    g = torch.Generator().manual_seed(0)
    B, T = 5, 300  # crosses the 128-token chunks
    mask = torch.rand(B, T, generator=g) < 0.8
    mask[1, 200:] = False  # right padding
    mask[2] = False  # empty response
    mask[3, :250] = False  # only a tail
    values = torch.randn(B, T, generator=g)
    rewards = torch.randn(B, generator=g)
    adv, ret = gae(rewards, values, mask, gamma, lambd)
    ref_adv, ref_ret = _gae_sequential(rewards, values, mask, gamma, lambd)
    # float32 arithmetic: a few ulps of |Â| (and of |V| for R̂ = Â + V)
    scale = ref_adv.abs() + torch.where(mask, values, 0.0).abs().double()
    assert ((adv.double() - ref_adv).abs() <= 1e-6 + 2e-6 * scale).all()
    assert ((ret.double() - ref_ret).abs() <= 1e-6 + 2e-6 * scale).all()
    assert adv.dtype == ret.dtype == torch.float32


def test_gae_garbage_at_masked_positions_changes_nothing():
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(3, 40, generator=g) < 0.6
    values = torch.randn(3, 40, generator=g)
    rewards = torch.randn(3, generator=g)
    clean = gae(rewards, values, mask, 0.95, 0.9)
    for junk in (float("nan"), 1e9, -float("inf")):
        dirty = gae(rewards, torch.where(mask, values, torch.full_like(values, junk)), mask, 0.95, 0.9)
        for a, b in zip(clean, dirty):
            assert torch.equal(a, b)


def test_gae_bfloat16_values_and_empty_batch():
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    adv, _ = gae(torch.tensor([1.0]), torch.tensor([[0.5, 0.5, 5.0]], dtype=torch.bfloat16), mask, 1.0, 0.95)
    torch.testing.assert_close(adv, torch.tensor([[0.475, 0.5, 0.0]]))
    adv, ret = gae(torch.zeros(0), torch.zeros(0, 4), torch.zeros(0, 4, dtype=torch.bool), 1.0, 1.0)
    assert adv.shape == ret.shape == (0, 4)
    adv, ret = gae(torch.tensor([2.0]), torch.zeros(1, 0), torch.zeros(1, 0, dtype=torch.bool), 1.0, 1.0)
    assert adv.shape == (1, 0)


def test_gae_block_path_hand_values_prefix_and_left_padded():
    # mask [1, 1, 1, 0], V = [0.5, 0.25, 0.5, (9)], R = 1, γ = 0.9, λ = 0.5 (γλ = 0.45):
    # δ = [0.9·0.25 − 0.5, 0.9·0.5 − 0.25, 1 − 0.5] = [−0.275, 0.2, 0.5]
    # Â = [−0.275 + 0.45·0.425, 0.2 + 0.45·0.5, 0.5] = [−0.08375, 0.425, 0.5]; R̂ = Â + V
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]], dtype=torch.bool)
    values = torch.tensor([[0.5, 0.25, 0.5, 9.0], [7.0, 0.5, 0.25, 0.5]])  # row 1: the same block, left-padded
    adv, ret = gae(torch.tensor([1.0, 1.0]), values, mask, gamma=0.9, lambd=0.5)
    expected = torch.tensor([-0.08375, 0.425, 0.5])
    torch.testing.assert_close(adv, torch.stack([torch.cat([expected, torch.zeros(1)]), torch.cat([torch.zeros(1), expected])]))
    torch.testing.assert_close(ret[0, :3], torch.tensor([0.41625, 0.675, 1.0]))
    torch.testing.assert_close(ret[1, 1:], torch.tensor([0.41625, 0.675, 1.0]))
    assert ret[0, 3] == 0 and ret[1, 0] == 0


def test_gae_closed_form_at_gamma_lambda_one_with_a_hole():
    # γ = λ = 1: the δ telescope over the valid tokens, Â_t = R − V_t, R̂_t = R
    mask = torch.tensor([[1, 0, 1]], dtype=torch.bool)
    adv, ret = gae(torch.tensor([2.0]), torch.tensor([[0.3, 99.0, 0.1]]), mask, 1.0, 1.0)
    torch.testing.assert_close(adv, torch.tensor([[1.7, 0.0, 1.9]]))
    torch.testing.assert_close(ret, torch.tensor([[2.0, 0.0, 2.0]]))


def _masks_without_holes(B, T, g):
    """Prefix masks, left-padded and interior blocks, an empty and a full row."""
    start = torch.randint(0, T // 3, (B,), generator=g)
    start[: B // 2] = 0  # prefixes
    end = start + torch.randint(0, T - T // 3, (B,), generator=g)
    pos = torch.arange(T)
    mask = (pos >= start[:, None]) & (pos <= end[:, None])
    mask[1] = False
    mask[2] = True
    return mask


def test_gae_no_holes_skips_packing_and_equals_the_packed_path(monkeypatch):
    import relax_ppo.ppo as ppo_mod

    g = torch.Generator().manual_seed(4)
    B, T = 12, 100
    mask = _masks_without_holes(B, T, g)
    values, rewards = torch.randn(B, T, generator=g), torch.randn(B, generator=g)
    calls = []
    monkeypatch.setattr(ppo_mod, "pack_valid", lambda m: calls.append(1) or pack_valid(m))
    fast = gae(rewards, values, mask, 0.99, 0.95)
    assert calls == []  # no holes: the block path
    # one extra row with a hole sends the whole batch through the packed path; rows are independent
    holey = torch.ones(1, T, dtype=torch.bool)
    holey[0, 40:45] = False
    packed = gae(torch.cat([rewards, torch.ones(1)]), torch.cat([values, torch.randn(1, T, generator=g)]),
                 torch.cat([mask, holey]), 0.99, 0.95)
    assert calls == [1]
    for f, p in zip(fast, packed):
        torch.testing.assert_close(f, p[:B], atol=1e-6, rtol=1e-6)
    ref_adv, ref_ret = _gae_sequential(rewards, values, mask, 0.99, 0.95)
    torch.testing.assert_close(fast[0].double(), ref_adv, atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(fast[1].double(), ref_ret, atol=2e-6, rtol=2e-6)


def _gae_sequential_f64(rewards, values, mask, gamma, lambd):
    """The same loop as :func:`_gae_sequential` on numpy float64 (fast enough for T = 8192)."""
    import numpy as np

    v, m = values.double().numpy(), mask.numpy()
    adv = np.zeros(v.shape)
    for i in range(v.shape[0]):
        a_next, v_next, r = 0.0, 0.0, float(rewards[i])
        for t in np.flatnonzero(m[i])[::-1]:
            a_next = r + gamma * v_next - v[i, t] + gamma * lambd * a_next
            adv[i, t], v_next, r = a_next, v[i, t], 0.0
    return torch.from_numpy(adv), torch.from_numpy(np.where(m, adv + v, 0.0))


@pytest.mark.parametrize("gamma,lambd", [(0.99, 0.99), (1.0, 1.0)])
def test_gae_long_sequences_float32_accuracy(gamma, lambd):
    g = torch.Generator().manual_seed(6)
    B, T = 3, 8192
    mask = torch.arange(T)[None, :] < torch.tensor([[T], [T - 1000], [5000]])
    values, rewards = torch.rand(B, T, generator=g), torch.tensor([1.0, 0.0, -1.0])
    holey = mask.clone()
    holey[0, 100:200] = False  # the packed path
    for m in (mask, holey):
        adv, ret = gae(rewards, values, m, gamma, lambd)
        ref_adv, ref_ret = _gae_sequential_f64(rewards, values, m, gamma, lambd)
        # a few float32 ulps of |Â| + |V| (≲ 2 here)
        assert float((adv.double() - ref_adv).abs().max()) < 2e-6
        assert float((ret.double() - ref_ret).abs().max()) < 2e-6


@pytest.mark.parametrize("gamma,lambd", [(1.0, 1.0), (0.99, 0.95)])
@pytest.mark.parametrize("holes", [False, True])
def test_gae_garbage_and_bfloat16_on_every_path(gamma, lambd, holes):
    g = torch.Generator().manual_seed(2)
    B, T = 6, 50
    mask = _masks_without_holes(B, T, g)
    if holes:
        mask[0, 10:12] = False
    values, rewards = torch.randn(B, T, generator=g), torch.randn(B, generator=g)
    rewards[1] = float("nan")  # an empty row may carry anything
    clean = gae(rewards, values, mask, gamma, lambd)
    assert not clean[0].requires_grad and torch.isfinite(clean[0]).all() and (clean[0][1] == 0).all()
    for junk in (float("nan"), 1e9, -float("inf")):
        dirty = gae(rewards, torch.where(mask, values, torch.full_like(values, junk)), mask, gamma, lambd)
        for a, b in zip(clean, dirty):
            assert torch.equal(a, b)
    v16 = values.to(torch.bfloat16)
    low = gae(rewards, v16, mask, gamma, lambd)
    ref = gae(rewards, v16.float(), mask, gamma, lambd)  # bfloat16 values are read exactly
    for a, b in zip(low, ref):
        assert a.dtype == torch.float32 and torch.equal(a, b)


def test_gae_empty_shapes_on_the_scan_paths():
    for gamma, lambd in ((0.99, 0.95), (0.5, 1.0)):
        adv, ret = gae(torch.zeros(0), torch.zeros(0, 4), torch.zeros(0, 4, dtype=torch.bool), gamma, lambd)
        assert adv.shape == ret.shape == (0, 4)
        adv, ret = gae(torch.tensor([2.0]), torch.zeros(1, 0), torch.zeros(1, 0, dtype=torch.bool), gamma, lambd)
        assert adv.shape == ret.shape == (1, 0)


def test_pack_valid_is_a_permutation_with_valid_tokens_first():
    mask = torch.tensor([[0, 1, 0, 1, 1], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    dest, packed_valid = pack_valid(mask)
    assert dest.tolist() == [[3, 0, 4, 1, 2], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]
    assert packed_valid.sum(-1).tolist() == [3, 0, 5]


def test_pack_valid_random_masks_pack_in_order_and_unpack():
    g = torch.Generator().manual_seed(15)
    mask = torch.rand(7, 33, generator=g) < 0.6
    mask[0], mask[1] = False, True
    x = torch.randn(7, 33, generator=g)
    dest, packed_valid = pack_valid(mask)
    assert torch.equal(dest.sort(-1).values, torch.arange(33).expand(7, 33))  # a permutation of each row
    packed = torch.zeros_like(x).scatter(1, dest, x)
    for i in range(7):  # valid tokens first in order, then the masked ones in order
        assert torch.equal(packed[i], torch.cat([x[i][mask[i]], x[i][~mask[i]]]))
    assert torch.equal(packed_valid.sum(-1), mask.sum(-1)) and torch.equal(packed.gather(1, dest), x)


def test_compute_advantages_unscored_sample_and_missing_values():
    est = _build("--gamma", "1.0", "--lambd", "1.0")
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    values = torch.tensor([[0.25, 0.5, 9.0], [0.1, 0.2, 0.3]])
    out = est.compute_advantages(AdvantageInput(
        rewards=torch.tensor([1.0, float("nan")]), group_index=torch.tensor([0, 1]),
        loss_mask=mask, values=values))
    # row 0 (γ = λ = 1): Â_t = R − V_t, R̂_t = R; row 1 unscored: Â = 0, R̂ = V
    torch.testing.assert_close(out.advantages, torch.tensor([[0.75, 0.5, 0.0], [0.0, 0.0, 0.0]]))
    torch.testing.assert_close(out.returns, torch.tensor([[1.0, 1.0, 0.0], [0.1, 0.2, 0.3]]))
    with pytest.raises(ValueError, match="critic's values"):
        est.compute_advantages(AdvantageInput(rewards=torch.tensor([1.0]), group_index=torch.tensor([0]),
                                              loss_mask=torch.ones(1, 2, dtype=torch.bool)))
    with pytest.raises(ValueError, match="shape of loss_mask"):
        est.compute_advantages(AdvantageInput(rewards=torch.tensor([1.0]), group_index=torch.tensor([0]),
                                              loss_mask=torch.ones(1, 2, dtype=torch.bool), values=torch.zeros(1, 3)))


# --------------------------------------------------------------------------- value loss


def test_value_clipfrac_from_the_unclipped_update_issue_value():
    mask = torch.tensor([[1, 0]], dtype=torch.bool)
    v = torch.tensor([[0.5, 0.5]], requires_grad=True)
    out = clipped_value_loss(v, torch.zeros(1, 2), torch.ones(1, 2), mask, 0.2)
    assert out.token_metrics["value_clipfrac"].tolist() == [[1.0, 0.0]]  # masked token not counted
    # R = 1: (v − R)² = 0.25, v_clip = 0.2 → (0.2 − 1)² = 0.64 is the larger: clip binds, grad 0
    torch.testing.assert_close(out.loss, torch.tensor([[0.64, 0.0]]))
    out.loss.sum().backward()
    assert v.grad.tolist() == [[0.0, 0.0]]


def test_value_loss_unclipped_branch_and_gradient():
    mask = torch.ones(1, 3, dtype=torch.bool)
    v = torch.tensor([[0.5, 0.1, -0.3]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 0.0]])
    ret = torch.tensor([[0.0, 1.0, -1.0]])
    out = clipped_value_loss(v, old, ret, mask, 0.2)
    # t1: (0.5)² = 0.25 ≥ (0.2)² → 0.25, grad 2·0.5; t2 inside the clip: 0.81, grad 2·(−0.9);
    # t3: (0.7)² = 0.49 vs v_clip −0.2 → 0.64: clipped branch, grad 0
    torch.testing.assert_close(out.loss, torch.tensor([[0.25, 0.81, 0.64]]))
    assert out.token_metrics["value_clipfrac"].tolist() == [[1.0, 0.0, 1.0]]
    out.loss.sum().backward()
    torch.testing.assert_close(v.grad, torch.tensor([[1.0, -1.8, 0.0]]))


def test_value_loss_gradcheck_float64_away_from_kinks():
    g = torch.Generator().manual_seed(2)
    old = torch.randn(3, 7, generator=g, dtype=torch.float64)
    ret = torch.randn(3, 7, generator=g, dtype=torch.float64)
    v = (old + 0.5 * torch.randn(3, 7, generator=g, dtype=torch.float64)).requires_grad_(True)
    mask = torch.rand(3, 7, generator=g) < 0.7
    # analytic: 2(v − R̂) where the unclipped square is strictly the larger, 0 where the clip binds
    out = clipped_value_loss(v, old, ret, mask, 0.2)
    out.loss.sum().backward()
    v_clip = old + (v.detach() - old).clamp(-0.2, 0.2)
    unclipped = (v.detach() - ret).square() >= (v_clip - ret).square()
    expected = torch.where(mask & unclipped, 2 * (v.detach() - ret), torch.zeros_like(ret))
    torch.testing.assert_close(v.grad, expected.to(torch.float64), atol=1e-5, rtol=1e-5)


def test_value_loss_garbage_and_bfloat16():
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    base = dict(old_values=torch.tensor([[0.0, 0.1, 0.0]]), returns=torch.tensor([[1.0, -1.0, 0.0]]))
    v0 = torch.tensor([[0.1, 0.0, 0.0]], requires_grad=True)
    clean = clipped_value_loss(v0, base["old_values"], base["returns"], mask, 0.2)
    clean.loss.sum().backward()
    nan = float("nan")
    v1 = torch.tensor([[0.1, 0.0, nan]], requires_grad=True)
    dirty = clipped_value_loss(v1, torch.tensor([[0.0, 0.1, 1e9]]), torch.tensor([[1.0, -1.0, nan]]), mask, 0.2)
    dirty.loss.sum().backward()
    assert torch.equal(clean.loss, dirty.loss) and torch.equal(v0.grad, v1.grad)
    vb = torch.tensor([[0.1, 0.0, 0.0]], dtype=torch.bfloat16, requires_grad=True)
    outb = clipped_value_loss(vb, base["old_values"], base["returns"], mask, 0.2)
    assert outb.loss.dtype == torch.float32
    outb.loss.sum().backward()
    assert vb.grad.dtype == torch.bfloat16
    torch.testing.assert_close(vb.grad.float(), v0.grad, atol=1e-2, rtol=1e-2)


def test_estimator_value_loss_uses_value_clip_flag():
    est = _build("--value-clip", "0.5")
    v = torch.tensor([[0.4]], requires_grad=True)
    out = est.value_loss(ValueLossInput(values=v, old_values=torch.zeros(1, 1), returns=torch.ones(1, 1),
                                        loss_mask=torch.ones(1, 1, dtype=torch.bool)))
    # |0.4| < 0.5: unclipped, (0.4 − 1)² = 0.36
    torch.testing.assert_close(out.loss, torch.tensor([[0.36]]))
    assert out.token_metrics["value_clipfrac"].item() == 0.0


# --------------------------------------------------------------------------- policy loss


def test_policy_loss_is_ppo_clip_with_the_run_clip_settings():
    est = _build("--eps-clip", "0.2", "--eps-clip-high", "0.28", "--eps-clip-c", "3")
    ratio = torch.tensor([[1.5, 0.5, 4.0]], dtype=torch.float64)
    lp = (torch.log(ratio) - 1.0).float().requires_grad_(True)
    A = torch.tensor([[1.0, -1.0, -1.0]])
    out = est.policy_loss(PolicyLossInput(log_probs=lp, old_log_probs=torch.full((1, 3), -1.0), advantages=A,
                                          loss_mask=torch.ones(1, 3, dtype=torch.bool)))
    # r = 1.5, A = 1: −1.28 (clip-high); r = 0.5, A = −1: max(0.5, 0.8) = 0.8; r = 4, A = −1:
    # max(4, 1.2) = 4 then dual clip min(4, c = 3) = 3
    torch.testing.assert_close(out.loss, torch.tensor([[-1.28, 0.8, 3.0]]))
    assert out.token_metrics["pg_clipfrac"].tolist() == [[1.0, 1.0, 1.0]]


# --------------------------------------------------------------------------- spec, params, CLI


def test_params_flags_and_critic_settings():
    est = _build("--gamma", "0.99", "--lambd", "0.95", "--value-clip", "0.3", "--critic-lr", "2e-6",
                 "--num-critic-only-steps", "5", "--critic-load", "/tmp/critic", "--lr", "1e-5")
    assert (est.gamma, est.lambd, est.value_clip) == (0.99, 0.95, 0.3)
    s = est.critic_settings
    assert (s.lr, s.load, s.num_critic_only_steps) == (2e-6, "/tmp/critic", 5)
    d = _build("--lr", "3e-6")
    assert (d.gamma, d.lambd, d.value_clip, d.critic_settings.lr, d.critic_settings.load,
            d.critic_settings.num_critic_only_steps) == (1.0, 1.0, 0.2, 3e-6, None, 0)
    from relax_core.config import RunConfig

    assert SPEC.build(None, None).critic_settings.lr == RunConfig().lr  # defaults when built bare


def test_capabilities_declared():
    c = CAPABILITIES
    assert c.needs_critic and c.sync_only and not c.supports_fully_async
    assert c.behaviour_numerator == "old_log_probs" and "kl_coef" not in c.uses_options
    assert SPEC.capabilities_for(None) is c


def test_cli_refuses_async_ppo_naming_capability_and_fix():
    from typer.testing import CliRunner

    from cli.main import app

    res = CliRunner().invoke(app, ["train", "--dry-run", "--advantage-estimator", "ppo", "--max-staleness", "1",
                                   "--fully-async", "--launcher", "ray"])
    assert res.exit_code == 2
    out = res.output
    assert "estimator 'ppo'" in out and "[sync_only]" in out and "--max-staleness 1" in out
    assert "[supports_fully_async]" in out and "fix:" in out and "--max-staleness 0" in out


def test_contract():
    from relax_authoring.testing import check_contract

    check_contract(SPEC)
