"""numerics.masked_fill_zero: ``torch.where(mask, x, 0)`` bit for bit in value and gradient
(computed on the bit patterns), whatever the masked slots hold."""

from __future__ import annotations

import math

import pytest
import torch

from relax_core.numerics import masked_fill_zero

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.float16])
def test_value_and_gradient_equal_where_bit_for_bit(dtype):
    mask = torch.tensor([[True, False, True, False, True], [False, True, True, True, False]])
    vals = [[1.5, NAN, -2.0, INF, -0.0], [1e4, -0.0, 3.0, NAN, -INF]]
    x = torch.tensor(vals, dtype=dtype, requires_grad=True)
    ref = torch.tensor(vals, dtype=dtype, requires_grad=True)
    y, want = masked_fill_zero(x, mask), torch.where(mask, ref, torch.zeros((), dtype=dtype))
    assert y.dtype == dtype and y.shape == want.shape
    assert torch.equal(y.detach().view(-1).view(torch.uint8), want.detach().view(-1).view(torch.uint8))
    assert y[0, 1].item() == 0.0 and math.copysign(1.0, y[1, 0].item()) == 1.0  # +0 where masked
    g = torch.tensor([[1.0, 2.0, NAN, 4.0, 5.0], [6.0, 7.0, 8.0, 9.0, NAN]], dtype=dtype)
    y.backward(g)
    want.backward(g)
    assert torch.equal(x.grad.view(-1).view(torch.uint8), ref.grad.view(-1).view(torch.uint8))
    assert x.grad[0].tolist()[1] == 0.0 and math.isnan(x.grad[0, 2].item())  # NaN passes at valid slots only


def test_broadcast_expanded_and_non_float_inputs():
    mask = torch.tensor([[True, False, True], [False, False, True]])
    a = torch.tensor([[2.0], [-3.0]], requires_grad=True)
    y = masked_fill_zero(a.expand(2, 3), mask)
    assert y.tolist() == [[2.0, 0.0, 2.0], [0.0, 0.0, -3.0]]
    y.sum().backward()
    assert a.grad.tolist() == [[2.0], [1.0]]
    ints = torch.tensor([[5, 6, 7], [8, 9, 10]])
    assert masked_fill_zero(ints, mask).tolist() == [[5, 0, 7], [0, 0, 10]]
    int_mask = torch.tensor([[1, 0, 1], [0, 0, 1]], dtype=torch.int32)
    assert masked_fill_zero(torch.ones(2, 3), int_mask).tolist() == [[1, 0, 1], [0, 0, 1]]
    assert int_mask.tolist() == [[1, 0, 1], [0, 0, 1]]  # the caller's mask is not modified
