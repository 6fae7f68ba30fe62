"""The core's optimizer step (relax_core.stages.optimizer): warm-up, the clip arithmetic (torch's
own numbers), non-finite skipping, and the calls it makes on a backend."""

from __future__ import annotations

import math

import pytest
import torch

from relax_core.contracts import Gradients
from relax_core.stages.optimizer import OptimizerSettings, clip_coefficient, optimizer_step

SETTINGS = OptimizerSettings(lr=0.3, critic_lr=0.03, warmup_steps=3, clip_grad=1.0)


def test_warm_up_is_linear_then_constant_per_role():
    assert [SETTINGS.lr_at("actor", s) for s in range(5)] == pytest.approx([0.1, 0.2, 0.3, 0.3, 0.3])
    assert SETTINGS.lr_at("critic", 0) == pytest.approx(0.01)
    assert OptimizerSettings(lr=0.3, critic_lr=0.3, warmup_steps=0, clip_grad=0).lr_at("actor", 0) == 0.3
    with pytest.raises(ValueError, match="'actor' or 'critic'"):
        SETTINGS.lr_at("ref", 0)


def test_clip_coefficient_is_torchs():
    assert clip_coefficient(4.0, 1.0) == float(torch.tensor(1.0) / (torch.tensor(4.0) + 1e-6)) == pytest.approx(0.25)
    assert clip_coefficient(0.5, 1.0) == 1.0 and clip_coefficient(4.0, 0.0) == 1.0
    g = torch.randn(7, generator=torch.Generator().manual_seed(0)) * 10  # float32, norm ≈ 20
    mine, theirs = g.clone(), g.clone().requires_grad_(True)
    theirs.grad = g.clone()
    norm = float(torch.nn.utils.clip_grad_norm_([theirs], 1.0))
    mine.mul_(clip_coefficient(norm, 1.0))
    assert torch.equal(mine, theirs.grad)  # bit-equal


class Recorder:
    """A backend that records the calls and returns the given gradients and norm."""

    def __init__(self, nonfinite=frozenset(), norm=4.0):
        self.nonfinite, self.norm, self.calls, self.steps = frozenset(nonfinite), norm, [], 2

    def accumulate_gradients(self, batch, loss_fn, *, role):
        self.calls.append(("accumulate", role))
        return Gradients(sums={"loss": 1.5}, nonfinite=self.nonfinite, micro_batches=3)

    def grad_norm(self, role):
        return self.norm

    def optimizer_steps(self, role):
        return self.steps

    def apply_gradients(self, role, *, lr, grad_scale):
        self.calls.append(("apply", role, lr, grad_scale))

    def zero_grad(self, role):
        self.calls.append(("zero", role))


def test_a_finite_step_is_clipped_warmed_up_and_applied():
    be = Recorder()
    r = optimizer_step(be, None, None, role="actor", settings=SETTINGS)
    assert be.calls == [("accumulate", "actor"), ("apply", "actor", pytest.approx(0.3), clip_coefficient(4.0, 1.0)),
                        ("zero", "actor")]
    assert (r.sums, r.grad_norm, r.lr, r.skipped, r.micro_batches, r.nonfinite) == (
        {"loss": 1.5}, 4.0, pytest.approx(0.3), False, 3, ())


@pytest.mark.parametrize("nonfinite,norm,names", [({"loss"}, 4.0, ("loss",)), (set(), math.nan, ("grad_norm",)),
                                                  ({"other_rank"}, math.inf, ("grad_norm", "other_rank"))])
def test_a_non_finite_step_is_skipped_and_its_gradients_released(nonfinite, norm, names):
    be = Recorder(nonfinite, norm)
    r = optimizer_step(be, None, None, role="critic", settings=SETTINGS)
    assert be.calls == [("accumulate", "critic"), ("zero", "critic")]
    assert r.skipped and r.nonfinite == names and r.lr == pytest.approx(0.03)
