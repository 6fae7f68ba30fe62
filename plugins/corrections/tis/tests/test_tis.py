"""TIS: pinned weights, numerator by the estimator's behaviour numerator, levels, metrics, gradients, masking."""

from __future__ import annotations

import math

import pytest
import torch

from relax_core.contracts import CorrectionInput
from relax_tis.plugin import TISParams
from relax_tis.tis import TIS, build


def make_input(old, rollout, *, current=None, numerator="old_log_probs", mask=None, adv=None, dtype=torch.float32):
    old = torch.as_tensor(old, dtype=dtype)
    old = old.reshape(1, -1) if old.dim() == 1 else old
    rollout = torch.as_tensor(rollout, dtype=dtype).reshape(old.shape)
    current = old.clone() if current is None else current
    log_probs = current.clone().requires_grad_(True)
    mask = torch.ones(old.shape, dtype=torch.bool) if mask is None else mask
    adv = torch.ones(old.shape, dtype=dtype) if adv is None else adv
    loss = -adv * log_probs  # a REINFORCE-shaped per-token loss, differentiable
    return CorrectionInput(loss=loss, log_probs=log_probs, old_log_probs=old, advantages=adv, loss_mask=mask,
                           behaviour_numerator=numerator, rollout_log_probs=rollout)


def weights(corr, inp):
    out = corr.apply(inp)
    return out.loss.detach() / inp.loss.detach(), out


def test_pinned_token_weights_and_metrics():
    d = torch.tensor([0.1, -1.5, 0.8, -10.0, 0.3])
    rho = torch.tensor([1.105171, 0.223130, 2.225541, 4.5400e-05, 1.349859])
    inp = make_input(d - 1.0, torch.full((5,), -1.0))  # log p_0 − log q = d
    w, out = weights(TIS(0.0, 2.0, "token"), inp)
    torch.testing.assert_close(w[0], torch.tensor([1.105171, 0.223130, 2.0, 4.5400e-05, 1.349859]), rtol=1e-5, atol=1e-7)
    m = out.token_metrics
    torch.testing.assert_close(m["tis"][0], rho, rtol=1e-5, atol=1e-7)
    assert m["tis_clipfrac"][0].tolist() == [0, 0, 1, 0, 0]
    torch.testing.assert_close(m["tis_abs"][0], (rho - 1).abs(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m["train_rollout_logprob_abs_diff"][0], d.abs())
    torch.testing.assert_close(m["ois"][0], torch.ones(5))  # current == old here


def test_slime_weight_rule_and_rho_four():
    ratios = torch.tensor([0.1, 0.5, 1.0, 2.0, 5.0, 4.0])
    assert TIS(0.5, 2.0, "token").is_weight(ratios).tolist() == [0.5, 0.5, 1.0, 2.0, 2.0, 2.0]
    w, _ = weights(TIS(0.0, 2.0, "token"), make_input([math.log(4.0)], [0.0]))
    assert w.item() == pytest.approx(2.0)


def test_numerator_is_the_field_the_estimator_declares():
    old, cur, q = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-0.5, -2.5]]), torch.tensor([[-1.2, -2.2]])
    w, out = weights(TIS(0.0, 10.0, "token"), make_input(old, q, current=cur, numerator="old_log_probs"))
    torch.testing.assert_close(w, torch.exp(old - q))
    torch.testing.assert_close(out.token_metrics["ois"], torch.exp(cur - old))
    w, out = weights(TIS(0.0, 10.0, "token"), make_input(old, q, current=cur, numerator="log_probs"))
    torch.testing.assert_close(w, torch.exp(cur - q))
    torch.testing.assert_close(out.token_metrics["train_rollout_logprob_abs_diff"], (cur - q).abs())


@pytest.mark.parametrize("level,expected", [("sequence", 0.367879), ("geometric", 0.999000)])
def test_sequence_and_geometric_levels_pinned(level, expected):
    # 1000 tokens, each log-ratio −0.001, followed by 24 masked garbage slots
    old = torch.cat([torch.full((1000,), -0.001), torch.full((24,), float("nan"))]).reshape(1, -1)
    q = torch.cat([torch.zeros(1000), torch.full((24,), 1e9)]).reshape(1, -1)
    mask = torch.arange(1024).reshape(1, -1) < 1000
    inp = make_input(old, q, current=torch.where(mask, old, torch.zeros(())), mask=mask)
    out = TIS(0.0, 2.0, level).apply(inp)
    w = out.loss.detach()[mask] / inp.loss.detach()[mask]
    torch.testing.assert_close(w, torch.full((1000,), expected), rtol=0, atol=2e-6)
    assert torch.isfinite(out.token_metrics["tis"]).all()


def test_sequence_level_is_per_sample_and_clips():
    old = torch.tensor([[0.5, 0.5, 0.0], [-0.1, 0.0, 0.0]])
    q = torch.zeros(2, 3)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    w, out = weights(TIS(0.0, 2.0, "sequence"), make_input(old, q, mask=mask))
    assert w[0, :2].tolist() == pytest.approx([2.0, 2.0])  # e^1 clipped to 2
    assert w[1, 0].item() == pytest.approx(math.exp(-0.1))
    assert out.token_metrics["tis_clipfrac"].tolist() == [[1, 1, 0], [0, 0, 0]]
    g = TIS(0.0, 5.0, "geometric").apply(make_input(old, q, mask=mask))
    assert g.token_metrics["tis"][0, :2].tolist() == pytest.approx([math.exp(0.5)] * 2)


def test_weights_carry_no_gradient():
    # REINFORCE: the numerator is the current policy, which has grad; the weight must not
    old, cur, q = torch.zeros(1, 4), torch.tensor([[-0.2, 0.3, 1.5, -0.7]]), torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -2.0, 0.5, 3.0]])
    inp = make_input(old, q, current=cur, numerator="log_probs", adv=adv)
    out = TIS(0.0, 2.0, "token").apply(inp)
    (grad,) = torch.autograd.grad(out.loss.sum(), inp.log_probs)
    torch.testing.assert_close(grad, -adv * torch.exp(cur - q).clamp(0, 2))


def test_masked_garbage_changes_neither_loss_nor_gradient():
    mask = torch.tensor([[True, True, False, False], [True, False, False, False]])
    old = torch.tensor([[-1.0, -0.5, 0.0, 0.0], [-2.0, 0.0, 0.0, 0.0]])
    q = torch.tensor([[-1.1, -0.2, 0.0, 0.0], [-1.5, 0.0, 0.0, 0.0]])
    garbage = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]], dtype=torch.bool)
    for level in ("token", "sequence", "geometric"):
        res = []
        for fill in (0.0, float("nan"), 1e9):
            o = torch.where(garbage, torch.full_like(old, fill), old)
            r = torch.where(garbage, torch.full_like(q, -fill), q)
            inp = make_input(o, r, current=torch.where(garbage, torch.zeros(()), o), mask=mask, numerator="log_probs")
            out = TIS(0.0, 2.0, level).apply(inp)
            (g,) = torch.autograd.grad(torch.where(mask, out.loss, 0.0).sum(), inp.log_probs)
            res.append((out.loss.detach()[mask], g, {k: v for k, v in out.token_metrics.items()}))
        for loss, g, m in res[1:]:
            torch.testing.assert_close(loss, res[0][0])
            torch.testing.assert_close(g, res[0][1])
            for k, v in m.items():
                assert torch.isfinite(v).all(), k
                torch.testing.assert_close(v, res[0][2][k])


def test_empty_response_and_bfloat16():
    mask = torch.tensor([[False, False], [True, True]])
    inp = make_input(torch.tensor([[0.3, 0.1], [0.2, -0.1]]), torch.zeros(2, 2), mask=mask)
    out = TIS(0.0, 2.0, "geometric").apply(inp)
    assert torch.isfinite(out.loss).all() and (out.token_metrics["tis"][0] == 0).all()
    b = make_input(torch.tensor([[0.3, -0.5]], dtype=torch.bfloat16), torch.zeros(1, 2, dtype=torch.bfloat16),
                   dtype=torch.bfloat16)
    out = TIS(0.0, 2.0, "token").apply(b)
    assert out.loss.dtype == torch.bfloat16
    torch.testing.assert_close(out.token_metrics["tis"].float(), torch.exp(b.old_log_probs.float()), rtol=1e-3, atol=1e-3)


def test_errors():
    with pytest.raises(ValueError, match="no per-token log-probs"):
        TIS(0.0, 2.0, "token").apply(make_input([0.0], [0.0]).replace(rollout_log_probs=None))
    with pytest.raises(ValueError, match="behaviour numerator 'weird' is not one of old_log_probs, log_probs"):
        TIS(0.0, 2.0, "token").apply(make_input([0.0], [0.0], numerator="weird"))
    with pytest.raises(ValueError, match="tis-clip-low"):
        build(TISParams(clip_low=3.0, clip=2.0), None)
    assert build(TISParams(), None).clip_low == 0.0


def _dry_run(*args):
    from typer.testing import CliRunner

    from cli.main import app

    return CliRunner().invoke(app, ["train", "--dry-run", "--correction", "tis", *args])


def test_startup_refusals_and_valid_runs():
    res = _dry_run("--use-rollout-logprobs")
    assert res.exit_code == 2
    assert "correction 'tis' (relax-tis" in res.output and "[conflicts_with_rollout_logprobs_as_old]" in res.output
    assert "fix: drop --use-rollout-logprobs or this correction" in res.output
    res = _dry_run("--tis-level", "sequence", "--context-parallel-size", "2")
    assert res.exit_code == 2 and "correction 'tis'" in res.output and "[supports_context_parallel]" in res.output
    for args in ((), ("--advantage-estimator", "rloo", "--calculate-per-token-loss"), ("--tis-level", "geometric")):
        res = _dry_run(*args)
        assert res.exit_code == 0, res.output


def test_contract():
    testing = pytest.importorskip("relax_authoring.testing")
    if not hasattr(testing, "check_contract"):
        pytest.skip("relax_authoring.testing.check_contract not available yet")
    from relax_tis.plugin import relax_register_corrections

    for level in ("token", "sequence", "geometric"):
        testing.check_contract(relax_register_corrections()[0], params=TISParams(level=level))


from relax_authoring.testing.training import train_tiny as _train  # noqa: E402  (2-step run of the real loop)


@pytest.mark.slow
def test_two_step_training_run(tmp_path):
    for m in _train(tmp_path, "--correction", "tis", "--tis-level", "geometric"):
        for name in ("train/tis", "train/tis_clipfrac", "train/tis_abs", "train/ois",
                     "train/train_rollout_logprob_abs_diff"):
            assert math.isfinite(m[name]), name
        assert m["train/tis"] == pytest.approx(1.0, abs=1e-3)  # same weights in engine and trainer
