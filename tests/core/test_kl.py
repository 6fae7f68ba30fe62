"""relax_core.numerics.kl_estimate: k1, k2, k3, low_var_kl values and gradients, clamps,
masking (NaN / 1e9 garbage), dtypes; the KL-loss composition with reduce_loss."""

import math

import pytest
import torch

from relax_core.numerics import KL_TYPES, kl_estimate, reduce_loss

NAN = float("nan")


def _value_and_grad(lp, ref, kind, dtype=torch.float32, mask=None):
    x = torch.tensor(lp, dtype=dtype).requires_grad_(True)
    kl = kl_estimate(x, torch.tensor(ref, dtype=dtype), kind, mask=mask)
    kl.sum().backward()
    return kl.detach(), x.grad


@pytest.mark.parametrize("kind,value,grad", [
    ("k1", 0.5, 1.0),  # x = 0.5
    ("k2", 0.125, 0.5),  # x²/2, d/dx = x
    ("k3", 0.106531, 0.393469),  # e^(−x) − 1 + x = 0.606531 − 1 + 0.5; d/dx = 1 − e^(−x)
    ("low_var_kl", 0.106531, 0.393469),
])
def test_issue_values_at_minus_one_and_minus_one_and_a_half(kind, value, grad):
    v, g = _value_and_grad([-1.0], [-1.5], kind)
    assert v.dtype == torch.float32
    assert v.item() == pytest.approx(value, abs=1e-6)
    assert g.item() == pytest.approx(grad, abs=1e-6)


def test_k3_matches_formula_on_a_grid_and_is_nonnegative():
    x = torch.linspace(-5, 5, 101, dtype=torch.float64)
    kl = kl_estimate(x, torch.zeros_like(x), "k3")
    torch.testing.assert_close(kl.double(), torch.exp(-x) - 1 + x, atol=1e-5, rtol=1e-5)
    assert (kl >= 0).all()
    tiny = torch.logspace(-8, -1, 50)  # cancellation near 0 must not make it negative
    assert (kl_estimate(tiny, torch.zeros_like(tiny), "k3") >= 0).all()
    assert (kl_estimate(-tiny, torch.zeros_like(tiny), "k3") >= 0).all()


@pytest.mark.parametrize("kind", KL_TYPES)
def test_extreme_log_ratio_is_finite_in_value_and_gradient(kind):
    v, g = _value_and_grad([-100.0, 100.0, 0.0], [0.0, 0.0, -100.0], kind)
    assert torch.isfinite(v).all() and torch.isfinite(g).all()


def test_clamps_k3_and_low_var_kl():
    # x = −100 → clamped to −20: k3 = e^20 − 21 (gradient 0 beyond the clamp); low_var_kl → 10
    v, g = _value_and_grad([-100.0], [0.0], "k3")
    assert v.item() == pytest.approx(math.exp(20) - 21, rel=1e-6)
    assert g.item() == 0.0
    v, g = _value_and_grad([-100.0], [0.0], "low_var_kl")
    assert v.item() == 10.0 and g.item() == 0.0
    # x = −3 inside the log-ratio clamp: k3 = e^3 − 4 = 16.09 > 10 → low_var_kl clamps, gradient 0
    v, _ = _value_and_grad([-3.0], [0.0], "k3")
    assert v.item() == pytest.approx(math.exp(3) - 4, rel=1e-6)
    v, g = _value_and_grad([-3.0], [0.0], "low_var_kl")
    assert v.item() == 10.0 and g.item() == 0.0
    # k1, k2 are not clamped
    assert _value_and_grad([-100.0], [0.0], "k2")[0].item() == 5000.0


@pytest.mark.parametrize("kind", KL_TYPES)
def test_mask_hides_garbage_from_value_and_gradient(kind):
    mask = torch.tensor([[True, False, True, False]])
    ref = torch.tensor([[-1.5, NAN, -0.2, 1e9]])
    lp_clean = torch.tensor([[-1.0, -1.0, -0.7, -1.0]], requires_grad=True)
    lp_dirty = torch.tensor([[-1.0, NAN, -0.7, 1e9]], requires_grad=True)
    outs = []
    for lp in (lp_clean, lp_dirty):
        kl = kl_estimate(lp, ref, kind, mask=mask)
        loss = reduce_loss(kl, mask, "seq-mean-token-mean")
        loss.backward()
        outs.append((kl.detach(), loss.detach()))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert torch.equal(lp_clean.grad, lp_dirty.grad)
    assert outs[0][0][0, 1].item() == 0.0 and lp_clean.grad[0, 1].item() == 0.0
    assert torch.isfinite(lp_dirty.grad).all()


def test_bfloat16_inputs_are_upcast_and_gradient_flows_back():
    v, g = _value_and_grad([-1.0], [-1.5], "k3", dtype=torch.bfloat16)
    assert v.dtype == torch.float32 and g.dtype == torch.bfloat16
    assert v.item() == pytest.approx(0.106531, abs=1e-6)  # −1 and −1.5 are exact in bfloat16
    assert g.float().item() == pytest.approx(0.393469, abs=4e-3)


def test_gradcheck_float64():
    x = torch.tensor([[-1.0, -0.3, -2.2]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -0.9, -0.1]], dtype=torch.float64)
    for kind in ("k1", "k2", "k3"):
        # kl_estimate computes in float32; compare against the analytic derivative instead
        kl = kl_estimate(x, ref, kind)
        (g,) = torch.autograd.grad(kl.sum(), x)
        d = (x - ref).detach()
        expected = {"k1": torch.ones_like(d), "k2": d, "k3": 1 - torch.exp(-d)}[kind]
        torch.testing.assert_close(g, expected, atol=1e-6, rtol=1e-5)


def test_kl_loss_composition_with_reduce_loss():
    """What the loop does for ``--use-kl-loss --kl-loss-coef c --kl-loss-type k2``: c·reduce(KL)."""
    lp = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, 0.0, 0.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    kl = kl_estimate(lp, ref, "k2", mask=mask)  # [[0.125, 0.5, 0], [0.125, 0, 0]]
    loss = 0.01 * reduce_loss(kl, mask, "seq-mean-token-mean")
    # per-sample means 0.3125 and 0.125 → mean over 2 samples 0.21875
    assert loss.item() == pytest.approx(0.0021875, abs=1e-9)
    loss.backward()
    # d/d lp = 0.01 · x / (n_i · 2): sample 0 x = [0.5, −1] / 4, sample 1 x = −0.5 / 2
    torch.testing.assert_close(lp.grad, torch.tensor([[0.00125, -0.0025, 0.0], [-0.0025, 0.0, 0.0]]))


def test_errors():
    with pytest.raises(ValueError, match="unknown KL type"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")
    with pytest.raises(ValueError, match="same shape"):
        kl_estimate(torch.zeros(2), torch.zeros(3), "k1")
