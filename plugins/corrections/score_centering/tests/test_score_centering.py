"""Score centering: pinned residuals, the dense expectation with a full-vocabulary head, zero
expected gradient with a constant advantage, gradients, masking, input checks, startup
refusals."""

from __future__ import annotations

import pytest
import torch

from relax_core.contracts import CorrectionInput
from relax_score_centering.plugin import ScoreCenteringParams
from relax_score_centering.score_centering import ScoreCentering, build, head_residual
from relax_tis.importance import band_weight, truncated_weight

TIS_RULE = lambda r: truncated_weight(r, 0.0, 2.0)  # noqa: E731
MIS_RULE = lambda r: band_weight(r, 0.5, 5.0)  # noqa: E731

# a worked example: vocabulary 4, logits z, sampler q
Z = torch.tensor([1.0, -1.0, 0.2, 2.0])
Q = torch.tensor([0.15, 0.55, 0.25, 0.05])


def test_pinned_two_token_head():
    c, P, Qm = head_residual(torch.tensor([0.4, 0.4]).log(), torch.tensor([0.5, 0.3]).log())
    torch.testing.assert_close(c, torch.tensor([0.1, -0.1]), rtol=0, atol=1e-6)
    assert (P.item(), Qm.item()) == pytest.approx((0.8, 0.8))


@pytest.mark.parametrize("rule,residual,correction", [
    (None, [0.542721, 0.225831], -2.387654),
    (TIS_RULE, [0.016893, 0.056086], -0.185153),
    (MIS_RULE, [-0.031452, -0.104424], 0.344725),
])
def test_oracle_top2_head(rule, residual, correction):
    # H = {1, 2}: P = 0.135875, Q = 0.8, ρ = 0.231448 (α = ρ, 2ρ, 1 for none / tis / mis)
    lp = torch.log_softmax(Z, -1)
    ids = torch.tensor([1, 2])
    c, P, Qm = head_residual(lp[ids], Q[ids].log(), rule)
    assert P.item() == pytest.approx(0.135875, abs=1e-6) and Qm.item() == pytest.approx(0.8)
    torch.testing.assert_close(c, torch.tensor(residual), rtol=0, atol=2e-6)
    assert (c * lp[ids]).sum().item() == pytest.approx(correction, abs=5e-6)


def test_full_head_residual_oracle():
    lp = torch.log_softmax(Z, -1)
    ids = torch.tensor([1, 2, 0, 3])  # ordered by q
    c, _, _ = head_residual(lp[ids], Q[ids].log())
    torch.testing.assert_close(c, torch.tensor([0.518548, 0.145576, -0.082399, -0.581726]), rtol=0, atol=2e-6)
    c, _, _ = head_residual(lp[ids], Q[ids].log(), TIS_RULE)
    torch.testing.assert_close(c, torch.tensor([0.0, 0.0, 0.0, -0.531726]), rtol=0, atol=2e-6)


def sc_input(z, q_head_log, ids, sampled, adv, *, loss=None, mask=None, rollout=None, response_ids=None,
             is_weight=None):
    """B rows at one position each (T = 1): row b samples token sampled[b] from logits z[b]."""
    logp = torch.log_softmax(z, -1)  # [B, V] with grad through z
    log_probs = logp.gather(-1, sampled[:, None])  # [B, 1]
    train_head = logp.gather(-1, ids)[:, None]  # [B, 1, k]
    mask = torch.ones(log_probs.shape, dtype=torch.bool) if mask is None else mask
    loss = -adv * log_probs if loss is None else loss
    return CorrectionInput(
        loss=loss, log_probs=log_probs, old_log_probs=log_probs.detach(), advantages=adv, loss_mask=mask,
        behaviour_numerator="log_probs", rollout_log_probs=rollout, top_k_ids=ids[:, None],
        top_k_log_probs=q_head_log[:, None], train_top_k_log_probs=train_head, is_weight=is_weight,
        response_ids=response_ids)


def test_p_equals_q_on_the_head_gives_plain_reinforce():
    z = torch.randn(3, 7, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    lp = torch.log_softmax(z.detach(), -1)
    ids = lp.topk(3, -1).indices
    inp = sc_input(z, lp.gather(-1, ids), ids, torch.tensor([0, 1, 2]), torch.tensor([[1.0], [-2.0], [0.5]]))
    out = ScoreCentering(3).apply(inp)
    torch.testing.assert_close(out.loss, inp.loss, rtol=0, atol=1e-7)
    g1 = torch.autograd.grad(out.loss.sum(), z, retain_graph=True)[0]
    g0 = torch.autograd.grad(inp.loss.sum(), z)[0]
    torch.testing.assert_close(g1, g0, rtol=0, atol=1e-6)


@pytest.mark.parametrize("rule", [None, TIS_RULE, MIS_RULE])
def test_full_vocabulary_head_equals_dense_expectation(rule):
    # ∇_z Σ_H c_v log p_v = E_q[w ∇_z log p] = q·w − (Σ q·w)·p  when H is the whole vocabulary
    g = torch.Generator().manual_seed(3)
    V = 6
    z = torch.randn(1, V, generator=g, dtype=torch.float32).requires_grad_(True)
    q = torch.softmax(torch.randn(1, V, generator=g) * 1.5, -1)
    ids = torch.arange(V)[None]
    adv = torch.ones(1, 1)
    inp = sc_input(z, q.log(), ids, torch.tensor([0]), adv, loss=torch.zeros(1, 1), is_weight=rule)
    out = ScoreCentering(V).apply(inp)
    (grad,) = torch.autograd.grad(out.loss.sum(), z)
    p = torch.softmax(z.detach(), -1)
    w = torch.ones_like(p) if rule is None else rule(p / q)
    (dense,) = torch.autograd.grad((q * w * torch.log_softmax(z, -1)).sum(), z)  # Σ_v q_v w_v ∇log p_v
    torch.testing.assert_close(grad, dense, rtol=0, atol=1e-6)
    torch.testing.assert_close(dense, q * w - (q * w).sum(-1, keepdim=True) * p, rtol=0, atol=1e-6)


def expected_gradient(rule, k, weights_of_q, adv_value=1.3):
    """E_{a ~ weights}[∇_z loss_a], one row per token a, for the REINFORCE loss
    −A·sg(w_a)·log p_a (w_a = rule(p_a / q_a), the TIS weight, or 1) plus score centering."""
    V = 4
    z = Z[None].expand(V, V).clone().requires_grad_(True)
    ids = Q.argsort(descending=True)[:k][None].expand(V, k)
    adv = torch.full((V, 1), adv_value)
    inp = sc_input(z, Q.log()[ids], ids, torch.arange(V), adv, is_weight=rule)
    if rule is not None:  # the sampled token's IS weight uses the distribution it is drawn from
        w_a = rule(torch.exp(inp.log_probs.detach() - weights_of_q.log()[:, None]))
        inp = inp.replace(loss=-adv * w_a * inp.log_probs)
    out = ScoreCentering(k).apply(inp)
    (grad,) = torch.autograd.grad((weights_of_q[:, None] * out.loss).sum(), z)
    return grad.sum(0)


@pytest.mark.parametrize("rule", [None, TIS_RULE])
def test_constant_advantage_expected_gradient_is_zero(rule):
    assert expected_gradient(rule, 4, Q).abs().max() < 1e-6  # full head: exact under q
    # top-2 head: exact under the tail model q̂ (tail ∝ ρ·p) ...
    p = torch.softmax(Z, -1)
    head = Q.argsort(descending=True)[:2]
    tail = torch.ones(4, dtype=torch.bool)
    tail[head] = False
    rho = (1 - Q[head].sum()) / (1 - p[head].sum())
    q_hat = torch.where(tail, rho * p, Q)
    assert expected_gradient(rule, 2, q_hat).abs().max() < 1e-6
    # ... but not under the true q (the tail approximation error: about ±0.0962 here)
    g = expected_gradient(rule, 2, Q)
    assert g.abs().max() > 1e-2
    if rule is None:
        torch.testing.assert_close(g / 1.3, torch.tensor([-0.0962, 0.0, 0.0, 0.0962]), rtol=0, atol=2e-4)


def test_gradient_of_head_is_advantage_times_residual_and_weights_detached():
    z = torch.randn(2, 5, generator=torch.Generator().manual_seed(4))
    lp = torch.log_softmax(z, -1)
    ids = torch.tensor([[0, 3], [4, 1]])
    q_log = torch.log(torch.tensor([[0.3, 0.2], [0.5, 0.1]]))
    train_head = lp.gather(-1, ids)[:, None].clone().requires_grad_(True)
    adv = torch.tensor([[2.0], [-1.0]])
    log_probs = lp[:, :1].clone().requires_grad_(True)
    inp = CorrectionInput(loss=-adv * log_probs, log_probs=log_probs, old_log_probs=log_probs.detach(),
                          advantages=adv, loss_mask=torch.ones(2, 1, dtype=torch.bool), behaviour_numerator="log_probs",
                          top_k_ids=ids[:, None], top_k_log_probs=q_log[:, None], train_top_k_log_probs=train_head,
                          is_weight=TIS_RULE)
    out = ScoreCentering(2).apply(inp)
    gh, gl = torch.autograd.grad(out.loss.sum(), [train_head, log_probs])
    c, _, _ = head_residual(train_head, q_log[:, None], TIS_RULE)
    torch.testing.assert_close(gh, adv[..., None] * c, rtol=0, atol=1e-7)
    torch.testing.assert_close(gl, -adv)  # SC adds nothing through the sampled token's log-prob
    torch.testing.assert_close(out.token_metrics["sc_correction"], (c * train_head.detach()).sum(-1))
    torch.testing.assert_close(out.token_metrics["sc_sampler_head_mass"], q_log.exp().sum(-1, keepdim=True))


def test_masked_garbage_changes_neither_loss_nor_gradients():
    g = torch.Generator().manual_seed(5)
    B, T, k = 2, 3, 2
    mask = torch.tensor([[True, True, False], [True, False, False]])
    lp = torch.log_softmax(torch.randn(B, T, 6, generator=g), -1)
    ids = torch.tensor([0, 2]).expand(B, T, k)
    heads = lp.gather(-1, ids)
    q_log = torch.log_softmax(torch.randn(B, T, 6, generator=g), -1).gather(-1, ids)
    adv = torch.tensor([[1.0], [-0.5]]).expand(B, T)
    res = []
    for fill in (0.0, float("nan"), 1e9):
        f3 = torch.full_like(heads, fill)
        th = torch.where(mask[..., None], heads, f3).requires_grad_(True)
        qh = torch.where(mask[..., None], q_log, f3)
        bad_ids = torch.where(mask[..., None], ids, torch.zeros_like(ids))  # repeated ids where masked
        lpr = torch.where(mask, lp[..., 0], torch.full_like(mask, fill, dtype=torch.float32)).requires_grad_(True)
        a = torch.where(mask, adv, torch.full_like(adv, fill))
        inp = CorrectionInput(loss=-a * lpr, log_probs=lpr, old_log_probs=lpr.detach(), advantages=a,
                              loss_mask=mask, behaviour_numerator="log_probs", top_k_ids=bad_ids, top_k_log_probs=qh,
                              train_top_k_log_probs=th, is_weight=MIS_RULE)
        out = ScoreCentering(k).apply(inp)
        (gh,) = torch.autograd.grad(torch.where(mask, out.loss, 0.0).sum(), th)
        assert all(torch.isfinite(v).all() for v in out.token_metrics.values())
        res.append((out.loss.detach()[mask], gh))
    for loss, gh in res[1:]:
        torch.testing.assert_close(loss, res[0][0])
        torch.testing.assert_close(gh, res[0][1])


def test_bfloat16_heads():
    z = torch.randn(2, 5, generator=torch.Generator().manual_seed(6))
    lp = torch.log_softmax(z, -1).to(torch.bfloat16)
    ids = torch.tensor([[0, 1], [2, 3]])
    adv = torch.ones(2, 1, dtype=torch.bfloat16)
    log_probs = lp[:, :1].clone().requires_grad_(True)
    head = lp.gather(-1, ids)[:, None].clone().requires_grad_(True)
    inp = CorrectionInput(loss=-adv * log_probs, log_probs=log_probs, old_log_probs=log_probs.detach(), advantages=adv,
                          loss_mask=torch.ones(2, 1, dtype=torch.bool), behaviour_numerator="log_probs",
                          top_k_ids=ids[:, None], top_k_log_probs=head.detach().float() - 0.1,
                          train_top_k_log_probs=head)
    out = ScoreCentering(2).apply(inp)
    assert out.loss.dtype == torch.bfloat16
    (gh,) = torch.autograd.grad(out.loss.float().sum(), head)
    assert torch.isfinite(gh).all() and gh.abs().sum() > 0


def test_input_checks():
    z = torch.zeros(1, 4, requires_grad=True)
    ids = torch.tensor([[0, 1]])
    ok = dict(z=z, ids=ids, sampled=torch.tensor([1]), adv=torch.ones(1, 1))
    lq = torch.log(torch.tensor([[0.5, 0.25]]))
    sc = ScoreCentering(2)
    with pytest.raises(ValueError, match="needs top_k_ids"):
        sc.apply(sc_input(q_head_log=lq, **ok).replace(top_k_log_probs=None))
    with pytest.raises(ValueError, match="mass > 1"):
        sc.apply(sc_input(q_head_log=torch.log(torch.tensor([[0.7, 0.5]])), **ok))
    with pytest.raises(ValueError, match="finite and <= 0"):
        sc.apply(sc_input(q_head_log=torch.tensor([[float("nan"), -1.0]]), **ok))
    with pytest.raises(ValueError, match="repeats"):
        sc.apply(sc_input(q_head_log=lq, **{**ok, "ids": torch.tensor([[1, 1]])}))
    # the engine's head must hold the sampled token at the rollout log-prob (same temperature)
    rollout_ok = lq[:, 1:2]  # sampled token 1 has log q = log 0.25
    sc.apply(sc_input(q_head_log=lq, rollout=rollout_ok, response_ids=torch.tensor([[1]]), **ok))
    with pytest.raises(ValueError, match="engine's top-k log-prob"):
        sc.apply(sc_input(q_head_log=lq, rollout=rollout_ok * 0.7, response_ids=torch.tensor([[1]]), **ok))
    with pytest.raises(ValueError, match="trainer's top-k log-prob"):
        bad = sc_input(q_head_log=lq, rollout=rollout_ok, response_ids=torch.tensor([[1]]), **ok)
        sc.apply(bad.replace(log_probs=bad.log_probs * 0.5))
    with pytest.raises(ValueError, match=">= 1"):
        build(ScoreCenteringParams(top_k=0), None)
    assert build(ScoreCenteringParams(), None).top_k == 128 and ScoreCentering.needs_top_k


def _dry_run(*args):
    from typer.testing import CliRunner

    from cli.main import app

    return CliRunner().invoke(app, ["train", "--dry-run", "--correction", "score_centering", *args])


@pytest.mark.parametrize("args,needle", [
    (["--advantage-estimator", "cispo", "--calculate-per-token-loss"], "behaviour numerator is old_log_probs (needs log_probs)"),
    (["--advantage-estimator", "grpo"], "behaviour numerator is old_log_probs (needs log_probs)"),
    (["--advantage-estimator", "gspo"], "behaviour numerator is old_log_probs (needs log_probs)"),
    (["--advantage-estimator", "rloo", "--calculate-per-token-loss", "--rollout-top-p", "0.9"], "--rollout-top-p must be 1"),
    (["--advantage-estimator", "rloo", "--calculate-per-token-loss", "--rollout-top-k", "8"], "--rollout-top-k must be -1"),
    (["--advantage-estimator", "rloo", "--calculate-per-token-loss", "--rollout-temperature", "0"], "--rollout-temperature must be > 0"),
    (["--advantage-estimator", "rloo", "--calculate-per-token-loss", "--rollout-repetition-penalty", "1.1"], "--rollout-repetition-penalty must be 1"),
    (["--advantage-estimator", "rloo", "--calculate-per-token-loss", "--correction", "tis", "--tis-level", "sequence"], "conflicts with score_centering"),
])
def test_startup_refusals(args, needle):
    if "tis" in args:
        pytest.importorskip("relax_tis")
    res = _dry_run(*args)
    assert res.exit_code == 2
    assert "correction 'score_centering'" in res.output or "correction 'tis'" in res.output
    assert needle in res.output and "fix:" in res.output


def test_valid_reinforce_setups():
    pytest.importorskip("relax_tis")
    for args in (["--advantage-estimator", "rloo", "--calculate-per-token-loss"],
                 ["--advantage-estimator", "grpo", "--pg-loss-type", "reinforce", "--correction", "tis",
                  "--score-centering-top-k", "16"]):
        res = _dry_run(*args)
        assert res.exit_code == 0, res.output


def test_contract():
    from relax_authoring.testing import check_contract
    from relax_score_centering.plugin import relax_register_corrections

    check_contract(relax_register_corrections()[0])


from relax_authoring.testing.training import train_tiny as _train  # noqa: E402  (2-step run of the real loop)


@pytest.mark.slow
def test_two_step_training_run(tmp_path):
    from safetensors.torch import load_file

    pytest.importorskip("relax_tis")
    steps = _train(tmp_path, "--correction", "score_centering", "--correction", "tis", "--advantage-estimator",
                   "grpo", "--pg-loss-type", "reinforce", "--score-centering-top-k", "8")
    for m in steps:
        assert 0 < m["train/sc_sampler_head_mass"] <= 1 and 0 < m["train/sc_train_head_mass"] <= 1
        assert m["train/sc_sampler_head_mass"] == pytest.approx(m["train/sc_train_head_mass"], rel=1e-3)
    batch = load_file(str(tmp_path / "rollouts" / "step_000001.safetensors"))
    assert batch["top_k_ids"].shape[-1] == 8 and batch["top_k_log_probs"].shape == batch["top_k_ids"].shape
