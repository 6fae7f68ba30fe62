"""relax_core.numerics.masked_normalize: the global token normalisation of REINFORCE++
(population variance, max(σ², eps)), masking, gradient, and the 2-rank gloo tests."""

import math

import pytest
import torch

from relax_core.numerics import masked_normalize

NAN = float("nan")


def test_one_process_pinned_values_and_stats():
    # the union of the two ranks of the distributed example, in one process
    v = torch.tensor([[1.0, 1e4, 3.0], [-1.0, 5.0, NAN]])
    m = torch.tensor([[True, False, True], [True, True, False]])
    out, s = masked_normalize(v, m)
    assert s == {"mean": 2.0, "var": 5.0, "count": 4.0}
    r5 = math.sqrt(5.0)
    torch.testing.assert_close(out, torch.tensor([[-1 / r5, 0.0, 1 / r5], [-3 / r5, 3 / r5, 0.0]]))
    assert out.dtype == torch.float32


def test_unbiased_single_token_and_eps_floor():
    v = torch.tensor([[1.0, 3.0]])
    m = torch.ones(1, 2, dtype=torch.bool)
    out, s = masked_normalize(v, m, unbiased=True)  # σ² = 2·1/(2−1) = 2
    assert s["var"] == 2.0
    torch.testing.assert_close(out, torch.tensor([[-1.0, 1.0]]) / math.sqrt(2.0))
    out, s = masked_normalize(torch.tensor([[4.0, 9.0]]), torch.tensor([[True, False]]))
    assert out.tolist() == [[0.0, 0.0]] and s["var"] == 0.0  # one token: zeros, never NaN
    out, s = masked_normalize(torch.tensor([[0.0, 1e-5]], dtype=torch.float64), m)  # σ² = 2.5e-11 < eps
    assert s["var"] == pytest.approx(2.5e-11)
    torch.testing.assert_close(out, torch.tensor([[-0.05, 0.05]], dtype=torch.float64))  # ±5e-6 / sqrt(1e-8)


def test_globally_empty_raises():
    with pytest.raises(ValueError, match="empty on every rank"):
        masked_normalize(torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool))


def test_dtypes_float64_kept_bfloat16_upcast():
    v = torch.tensor([[1.0, 2.0, 4.0]])
    m = torch.ones(1, 3, dtype=torch.bool)
    ref, _ = masked_normalize(v, m)
    out64, _ = masked_normalize(v.double(), m)
    outbf, _ = masked_normalize(v.bfloat16(), m)
    assert out64.dtype == torch.float64 and outbf.dtype == torch.float32
    torch.testing.assert_close(out64.float(), ref)
    torch.testing.assert_close(outbf, ref)  # 1, 2, 4 are exact in bfloat16


def test_gradient_matches_analytic_and_ignores_garbage():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, generator=g, dtype=torch.float64)
    m = torch.rand(3, 5, generator=g) < 0.7
    x_clean = x.clone().requires_grad_(True)
    w = torch.randn(3, 5, generator=g, dtype=torch.float64)
    out, _ = masked_normalize(x_clean, m)
    (out * w).sum().backward()
    # analytic: y = (x − μ)/σ over the N valid tokens; dL/dx = (w − mean(w) − y·mean(w·y))/σ
    n = m.sum()
    xv = x[m]
    mu = xv.mean()
    sigma = ((xv - mu) ** 2).mean().sqrt()
    y = (xv - mu) / sigma
    wv = w[m]
    expected = torch.zeros_like(x)
    expected[m] = (wv - wv.mean() - y * (wv * y).sum() / n) / sigma
    torch.testing.assert_close(x_clean.grad, expected)
    # NaN and 1e9 at masked slots: same value, same gradient
    x_dirty = torch.where(m, x, torch.full_like(x, NAN))
    x_dirty[0, 0] = 1e9 if not m[0, 0] else x_dirty[0, 0]
    x_dirty.requires_grad_(True)
    out2, _ = masked_normalize(x_dirty, m)
    (out2 * w).sum().backward()
    assert torch.equal(out, out2) and torch.equal(x_clean.grad, x_dirty.grad)


def test_two_gloo_ranks(tmp_path):
    import normalize_dist as nd

    r0, r1 = nd.spawn(2, "cases", str(tmp_path))
    r5 = math.sqrt(5.0)
    # rank 0 [1, 1e4 (masked), 3], rank 1 [−1, 5] → μ = 2, σ² = 5
    torch.testing.assert_close(r0["pinned"], torch.tensor([[-1 / r5, 0.0, 1 / r5]]))
    torch.testing.assert_close(r1["pinned"], torch.tensor([[-3 / r5, 3 / r5]]))
    for r in (r0, r1):
        assert r["pinned_stats"].tolist() == [2.0, 5.0, 4.0]
        assert r["empty_rank_stats"].tolist() == [3.0, 1.0, 2.0]
        assert "empty on every rank" in r["global_empty"]
    # the rank with no valid token joined; the result equals the one-process result
    torch.testing.assert_close(r0["empty_rank"], torch.tensor([[-1.0, 1.0]]))
    assert r1["empty_rank"].tolist() == [[0.0, 0.0]]
    one, m = nd.whole_batch()
    ref, _ = masked_normalize(one, m)
    ref64, _ = masked_normalize(one.double(), m)
    for rank, r in enumerate((r0, r1)):
        torch.testing.assert_close(r["sharded"], ref[rank::2], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(r["sharded64"], ref64[rank::2], atol=1e-12, rtol=1e-12)
