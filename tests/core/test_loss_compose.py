"""relax_core.stages.loss: policy loss → corrections in order → reduce with global denominators
→ + KL loss − entropy bonus; hand-derived values, gradients, masking, micro-batch sums."""

from __future__ import annotations

import math

import pytest
import torch

from relax_core.batch import Batch
from relax_core.contracts import CorrectionOutput, ForwardOutput, PolicyLossOutput
from relax_core.stages.loss import ActorLoss, LossSettings

NAN = math.nan


class Reinforce:
    """L_t = −A_t · log π_t; token metric pg_clipfrac = 0, scalar metric 'k' = 2."""

    def policy_loss(self, inp):
        return PolicyLossOutput(loss=-inp.advantages * inp.log_probs,
                                token_metrics={"pg_clipfrac": torch.zeros_like(inp.log_probs)},
                                scalar_metrics={"k": 2.0})


class Times2:
    def apply(self, inp):
        return CorrectionOutput(loss=inp.loss * 2, token_metrics={"tis": torch.full_like(inp.loss, 3.0)})


class Plus1:
    def apply(self, inp):
        return CorrectionOutput(loss=inp.loss + 1)


def _batch():
    mask = torch.tensor([[True, True, False], [True, False, False]])
    lp = torch.tensor([[-1.0, -2.0, NAN], [-0.5, 1e9, NAN]], requires_grad=True)
    t = {"advantages": torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]]),
         "ref_log_probs": torch.tensor([[-1.5, -2.0, NAN], [-0.5, 7.0, NAN]]),
         "old_log_probs": torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])}
    tb = Batch(prompt_ids=[[1], [2]], response_ids=torch.zeros(2, 3, dtype=torch.long), loss_mask=mask, **t)
    ent = torch.tensor([[2.0, 1.0, NAN], [3.0, 1e9, NAN]])
    return tb, lp, ent


def _settings(reduction="token-mean", kl=0.0, ent=0.0):
    return LossSettings(reduction=reduction, norm_constant=3.0, use_kl_loss=kl > 0, kl_loss_coef=kl, kl_loss_type="k1",
                        entropy_coef=ent, behaviour_numerator="log_probs")


@pytest.mark.parametrize("reduction,want", [("token-mean", 2.5 / 3), ("seq-mean-token-mean", 0.5),
                                            ("seq-mean-token-sum", 1.25), ("seq-mean-token-sum-norm", 1.25 / 3)])
def test_reductions_of_the_policy_loss(reduction, want):
    # per-token pg = [[1, 2, -], [-0.5, -, -]]
    tb, lp, ent = _batch()
    fn = ActorLoss(Reinforce(), [], _settings(reduction), num_tokens=3, num_samples=2, old_from_current=False)
    loss, _ = fn(tb, ForwardOutput(log_probs=lp, entropy=ent))
    assert float(loss) == pytest.approx(want, abs=1e-6)


def test_kl_and_entropy_terms_values_gradient_and_metrics():
    tb, lp, ent = _batch()
    fn = ActorLoss(Reinforce(), [], _settings(kl=0.1, ent=0.01), num_tokens=3, num_samples=2, old_from_current=False)
    loss, _ = fn(tb, ForwardOutput(log_probs=lp, entropy=ent))
    # pg 2.5/3; KL k1 = [[0.5, 0], [0]] → 0.5/3; entropy mean 6/3 = 2
    assert float(loss) == pytest.approx(2.5 / 3 + 0.1 * 0.5 / 3 - 0.01 * 2.0, abs=1e-6)
    loss.backward()
    g = lp.grad
    assert torch.isfinite(g).all()
    assert g[0, 0].item() == pytest.approx((-1.0 + 0.1) / 3, abs=1e-6)
    assert g[1, 0].item() == pytest.approx((1.0 + 0.1) / 3, abs=1e-6)
    assert g[0, 2].item() == 0.0 and g[1, 1].item() == 0.0 and g[1, 2].item() == 0.0
    m = fn.metrics()
    assert m["train/pg_loss"] == pytest.approx(2.5 / 3, abs=1e-6)
    assert m["train/kl_loss"] == pytest.approx(0.5 / 3, abs=1e-6)
    assert m["train/entropy"] == pytest.approx(2.0, abs=1e-6)
    assert m["train/pg_clipfrac"] == 0.0 and m["train/k"] == pytest.approx(2.0)


@pytest.mark.parametrize("reduction,reduced", [("token-mean", 2.0), ("seq-mean-token-mean", 2.25)])
def test_entropy_is_logged_in_the_runs_reduction_and_as_a_token_mean(reduction, reduced):
    # entropy [[2, 1, -], [3, -, -]] (masked slots NaN / 1e9): token mean 6/3 = 2;
    # mean of sequence means (1.5 + 3)/2 = 2.25; the bonus uses the run's reduction
    tb, lp, ent = _batch()
    fn = ActorLoss(Reinforce(), [], _settings(reduction, ent=0.5), num_tokens=3, num_samples=2,
                   old_from_current=False)
    fn(tb, ForwardOutput(log_probs=lp, entropy=ent))
    m = fn.metrics()
    assert m["train/entropy"] == pytest.approx(reduced, abs=1e-6)
    assert m["train/entropy_token_mean"] == pytest.approx(2.0, abs=1e-6)
    assert m["train/loss"] == pytest.approx(m["train/pg_loss"] - 0.5 * reduced, abs=1e-6)


def test_corrections_apply_in_the_given_order():
    tb, lp, ent = _batch()
    a = ActorLoss(Reinforce(), [Times2(), Plus1()], _settings(), num_tokens=3, num_samples=2, old_from_current=False)
    b = ActorLoss(Reinforce(), [Plus1(), Times2()], _settings(), num_tokens=3, num_samples=2, old_from_current=False)
    la, _ = a(tb, ForwardOutput(log_probs=lp, entropy=None))
    lb, _ = b(tb, ForwardOutput(log_probs=lp, entropy=None))
    assert float(la) == pytest.approx((3 + 5 + 0) / 3, abs=1e-6)  # 2x + 1
    assert float(lb) == pytest.approx((4 + 6 + 1) / 3, abs=1e-6)  # 2(x + 1)
    assert a.metrics()["train/tis"] == pytest.approx(3.0)


@pytest.mark.parametrize("reduction", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batches_sum_to_the_global_batch(reduction):
    tb, lp, ent = _batch()
    full = ActorLoss(Reinforce(), [], _settings(reduction, kl=0.1, ent=0.01), num_tokens=3, num_samples=2,
                     old_from_current=False)
    lf, _ = full(tb, ForwardOutput(log_probs=lp, entropy=ent))
    gf = torch.autograd.grad(lf, lp)[0]
    parts = ActorLoss(Reinforce(), [], _settings(reduction, kl=0.1, ent=0.01), num_tokens=3, num_samples=2,
                      old_from_current=False)
    total, grads = 0.0, []
    for i in range(2):
        lpi = lp.detach()[i:i + 1].clone().requires_grad_(True)
        mb = tb.slice(i, i + 1)
        li, _ = parts(mb, ForwardOutput(log_probs=lpi, entropy=ent[i:i + 1]))
        total += float(li)
        grads.append(torch.autograd.grad(li, lpi)[0])
    assert total == pytest.approx(float(lf), abs=1e-6)
    torch.testing.assert_close(torch.cat(grads), gf)
    for k, v in full.metrics().items():
        assert parts.metrics()[k] == pytest.approx(v, abs=1e-6), k


def test_old_from_current_gives_ratio_one():
    tb, lp, ent = _batch()
    seen = {}

    class Spy(Reinforce):
        def policy_loss(self, inp):
            seen["old"] = inp.old_log_probs
            return super().policy_loss(inp)

    fn = ActorLoss(Spy(), [], _settings(), num_tokens=3, num_samples=2, old_from_current=True)
    fn(tb, ForwardOutput(log_probs=lp, entropy=None))
    assert not seen["old"].requires_grad
    torch.testing.assert_close(seen["old"], lp.detach(), equal_nan=True)
