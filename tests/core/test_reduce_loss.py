"""``numerics.reduce_loss``: worked values, masking, and shard / micro-batch invariance."""

import math

import pytest
import torch

from relax_core.numerics import REDUCTIONS, reduce_loss

GARBAGE = (float("nan"), 1e9, float("inf"))


def _ab(dtype=torch.float64):
    """Sample A: 2 tokens of loss 1; sample B: 4 tokens of loss 3; T = 4."""
    loss = torch.tensor([[1.0, 1.0, 0.0, 0.0], [3.0, 3.0, 3.0, 3.0]], dtype=dtype)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    return loss, mask


@pytest.mark.parametrize("mode,expected", [
    ("token-mean", 14 / 6),               # (2·1 + 4·3) / 6 tokens
    ("seq-mean-token-mean", 2.0),         # (1 + 3) / 2 samples
    ("seq-mean-token-sum", 7.0),          # (2 + 12) / 2
    ("seq-mean-token-sum-norm", 1.75),    # (2 + 12) / (4 · 2)
])
def test_issue_example_values(mode, expected):
    loss, mask = _ab()
    out = reduce_loss(loss, mask, mode, norm_constant=4)
    assert out.item() == pytest.approx(expected, abs=1e-12)
    assert round(reduce_loss(loss.float(), mask, mode, norm_constant=4).item(), 6) == round(expected, 6)


@pytest.mark.parametrize("garbage", GARBAGE)
def test_masked_values_reach_neither_value_nor_gradient(garbage):
    base = torch.tensor([[1.0, 100.0], [1.0, -50.0]])
    mask = torch.tensor([[1, 0], [1, 0]], dtype=torch.bool)
    for masked in (base, torch.tensor([[1.0, garbage], [1.0, garbage]])):
        x = masked.clone().requires_grad_(True)
        out = reduce_loss(x, mask, "token-mean")
        out.backward()
        assert out.item() == 1.0
        assert x.grad.tolist() == [[0.5, 0.0], [0.5, 0.0]]


@pytest.mark.parametrize("mode", REDUCTIONS)
def test_garbage_in_masked_slots_changes_nothing_in_every_mode(mode):
    loss, mask = _ab()
    outs = []
    for fill in (0.0, *GARBAGE):
        x = torch.where(mask, loss, torch.full_like(loss, fill)).requires_grad_(True)
        out = reduce_loss(x, mask, mode, norm_constant=4)
        out.backward()
        assert math.isfinite(out.item()) and torch.isfinite(x.grad).all()
        outs.append((out.item(), x.grad.clone()))
    for v, g in outs[1:]:
        assert v == outs[0][0]
        assert torch.equal(g, outs[0][1])


def test_fully_masked_sample():
    loss, mask = _ab()
    loss3 = torch.cat([loss, torch.full((1, 4), float("nan"), dtype=loss.dtype)])
    mask3 = torch.cat([mask, torch.zeros(1, 4, dtype=torch.bool)])
    # token-mean: adds nothing to the denominator
    assert reduce_loss(loss3, mask3, "token-mean").item() == pytest.approx(14 / 6)
    # per-sample modes: contributes 0 but counts as a sample
    assert reduce_loss(loss3, mask3, "seq-mean-token-mean").item() == pytest.approx(4 / 3)
    assert reduce_loss(loss3, mask3, "seq-mean-token-sum").item() == pytest.approx(14 / 3)
    # nothing valid at all: 0, not NaN
    for mode in REDUCTIONS:
        assert reduce_loss(torch.full((2, 3), float("nan")), torch.zeros(2, 3, dtype=torch.bool), mode,
                           norm_constant=3).item() == 0.0


def _value_and_grad(loss, mask, mode, **kw):
    x = loss.clone().requires_grad_(True)
    out = reduce_loss(x, mask, mode, norm_constant=5, **kw)
    out.backward()
    return out.detach(), x.grad


def _random_batch(B=6, T=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.tensor([7, 0, 3, 5, 1, 6])[:B]
    mask = torch.arange(T)[None, :] < lengths[:, None]
    loss = torch.where(mask, loss, torch.full_like(loss, float("nan")))
    return loss, mask


@pytest.mark.parametrize("mode", REDUCTIONS)
def test_sum_over_data_parallel_shards_and_micro_batches(mode):
    loss, mask = _random_batch()
    full_v, full_g = _value_and_grad(loss, mask, mode)
    glob = {"num_tokens": mask.sum(), "num_samples": mask.shape[0]}
    for pieces in ([slice(0, 3), slice(3, 6)], [slice(0, 1), slice(1, 4), slice(4, 5), slice(5, 6)]):
        v, grads = 0.0, []
        for sl in pieces:
            pv, pg = _value_and_grad(loss[sl], mask[sl], mode, **glob)
            v, grads = v + pv, grads + [pg]
        torch.testing.assert_close(v, full_v, rtol=0, atol=1e-12)
        torch.testing.assert_close(torch.cat(grads), full_g, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", REDUCTIONS)
def test_sum_over_context_parallel_pieces(mode):
    """Each sequence split along T over 2 ranks: global per-sample token counts needed."""
    loss, mask = _random_batch()
    full_v, full_g = _value_and_grad(loss, mask, mode)
    glob = {"num_tokens": mask.sum(), "num_samples": mask.shape[0], "tokens_per_sample": mask.sum(-1)}
    cut = 3
    v0, g0 = _value_and_grad(loss[:, :cut], mask[:, :cut], mode, **glob)
    v1, g1 = _value_and_grad(loss[:, cut:], mask[:, cut:], mode, **glob)
    torch.testing.assert_close(v0 + v1, full_v, rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.cat([g0, g1], dim=1), full_g, rtol=0, atol=1e-12)


def test_context_parallel_without_global_counts_is_wrong():
    """Guards the test above: local per-sample counts give a different value."""
    loss, mask = _random_batch()
    full_v, _ = _value_and_grad(loss, mask, "seq-mean-token-mean")
    v0, _ = _value_and_grad(loss[:, :3], mask[:, :3], "seq-mean-token-mean", num_samples=6)
    v1, _ = _value_and_grad(loss[:, 3:], mask[:, 3:], "seq-mean-token-mean", num_samples=6)
    assert abs((v0 + v1) - full_v).item() > 1e-3


def test_gradient_matches_formula():
    loss, mask = _random_batch()
    m = mask.to(loss.dtype)
    n_i = m.sum(-1).clamp(min=1)
    expected = {
        "token-mean": m / m.sum(),
        "seq-mean-token-mean": m / n_i[:, None] / 6,
        "seq-mean-token-sum": m / 6.0,
        "seq-mean-token-sum-norm": m / (5.0 * 6),
    }
    for mode, want in expected.items():
        _, g = _value_and_grad(loss, mask, mode)
        torch.testing.assert_close(g, want, rtol=0, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_dtypes(dtype):
    loss, mask = _ab(dtype)
    out = reduce_loss(loss, mask, "seq-mean-token-mean")
    assert out.dtype == dtype and out.item() == 2.0


def test_errors():
    loss, mask = _ab()
    with pytest.raises(ValueError, match="unknown loss reduction 'mean'"):
        reduce_loss(loss, mask, "mean")
    with pytest.raises(ValueError, match="positive norm_constant"):
        reduce_loss(loss, mask, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match=r"tokens_per_sample must have shape \(2,\)"):
        reduce_loss(loss, mask, "seq-mean-token-mean", tokens_per_sample=torch.ones(3))
