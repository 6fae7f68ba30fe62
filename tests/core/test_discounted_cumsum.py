"""relax_core.numerics.discounted_cumsum: the chunked reverse scan of returns and GAE."""

import pytest
import torch

from relax_core.numerics import discounted_cumsum, last_valid_index


def _sequential(x, d):
    y = torch.zeros_like(x)
    acc = torch.zeros_like(x[..., 0])
    for t in reversed(range(x.shape[-1])):
        acc = x[..., t] + d * acc
        y[..., t] = acc
    return y


def test_hand_values():
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    # y2 = 3, y1 = 2 + 0.5·3 = 3.5, y0 = 1 + 0.5·3.5 = 2.75
    assert discounted_cumsum(x, 0.5).tolist() == [2.75, 3.5, 3.0]
    assert discounted_cumsum(x, 1.0).tolist() == [6.0, 5.0, 3.0]
    assert discounted_cumsum(x, 0.0).tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("t", [1, 2, 7, 128, 129, 300, 1100])
@pytest.mark.parametrize("d", [0.0, 0.5, 0.95, 1.0])
@pytest.mark.parametrize("chunk", [2, 5, 128])
def test_equals_sequential_reference(t, d, chunk):
    x = torch.randn(2, 3, t, generator=torch.Generator().manual_seed(t), dtype=torch.float64)
    torch.testing.assert_close(discounted_cumsum(x, d, chunk=chunk), _sequential(x, d), atol=1e-9, rtol=1e-9)


def test_long_sequence_small_discount_does_not_overflow_and_float32_is_close():
    x = torch.randn(4, 5000, generator=torch.Generator().manual_seed(0))
    y = discounted_cumsum(x, 0.5)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.double(), _sequential(x.double(), 0.5), atol=1e-5, rtol=1e-5)


def test_empty_and_gradient_and_errors():
    assert discounted_cumsum(torch.zeros(3, 0), 0.9).shape == (3, 0)
    x = torch.randn(1, 200, dtype=torch.float64, requires_grad=True)
    w = torch.randn(1, 200, dtype=torch.float64)
    (discounted_cumsum(x, 0.9, chunk=16) * w).sum().backward()
    # dL/dx_u = Σ_{t≤u} 0.9^(u−t) w_t: the forward discounted cumsum of w
    expected = _sequential(w.flip(-1), 0.9).flip(-1)
    torch.testing.assert_close(x.grad, expected)
    with pytest.raises(ValueError, match="discount"):
        discounted_cumsum(torch.zeros(3), 1.5)
    with pytest.raises(ValueError, match="chunk"):
        discounted_cumsum(torch.zeros(3), 0.5, chunk=1)


def _sequential_f64(x, d):
    """float64 loop over positions, on numpy (fast enough for T = 8192)."""
    import numpy as np

    xs = x.double().numpy()
    y = np.zeros_like(xs)
    acc = np.zeros(xs.shape[:-1])
    for t in reversed(range(xs.shape[-1])):
        acc = xs[..., t] + d * acc
        y[..., t] = acc
    return torch.from_numpy(y)


@pytest.mark.parametrize("d", [0.99 * 0.99, 0.9999, 1.0])
def test_float32_long_sequence_accuracy(d):
    # T = 8192 float32 against a float64 loop: within a few ulps of the largest partial sum
    g = torch.Generator().manual_seed(3)
    v = torch.rand(3, 8192, generator=g)
    x = 0.99 * torch.nn.functional.pad(v[:, 1:], (0, 1)) - v  # GAE-like δ: cancelling terms
    x[:, -1] += 1.0
    ref = _sequential_f64(x, d)
    y = discounted_cumsum(x, d)
    assert y.dtype == torch.float32
    scale = float(ref.abs().max()) if d < 1 else float(x.double().cumsum(-1).abs().max() + ref.abs().max())
    assert float((y.double() - ref).abs().max()) <= 16 * torch.finfo(torch.float32).eps * max(scale, 1.0)


@pytest.mark.parametrize("t,d,chunk", [(1024, 0.9, 32), (2048, 0.95, 8), (300, 1.0, 32), (7, 1.0, 2)])
def test_gradient_exact_multiples_and_discount_one(t, d, chunk):
    # T a multiple of the chunk (no padding copy, several recursion levels) and the cumsum form
    g = torch.Generator().manual_seed(t)
    x = torch.randn(2, t, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(2, t, dtype=torch.float64, generator=g)
    y = discounted_cumsum(x, d, chunk=chunk)
    torch.testing.assert_close(y, _sequential(x.detach(), d), atol=1e-9, rtol=1e-9)
    (y * w).sum().backward()
    torch.testing.assert_close(x.grad, _sequential(w.flip(-1), d).flip(-1))  # Σ_{t≤u} d^(u−t) w_t


def test_last_valid_index():
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 1, 0]], dtype=torch.bool)
    assert last_valid_index(mask).tolist() == [1, 3, 3, 3, 2]  # empty row: T − 1
    assert last_valid_index(torch.zeros(0, 5, dtype=torch.bool)).shape == (0,)


def test_discount_one_has_no_cancellation_against_a_large_prefix():
    """A large first entry must not cost the later suffix sums their accuracy (review: the
    total-minus-cumsum form gave 1.3e-4 absolute error on values near 1.8)."""
    x = torch.full((8192,), 1e-4)
    x[0] = -3000.0
    x[-1] = 1.0
    want = torch.flip(torch.cumsum(torch.flip(x.double(), [0]), 0), [0])
    got = discounted_cumsum(x, 1.0)
    assert (got[1:].double() - want[1:]).abs().max() < 1e-6


def test_last_valid_index_refuses_a_non_bool_mask():
    with pytest.raises(TypeError, match="bool"):
        last_valid_index(torch.ones(2, 3))
