"""Shared numerics: masked reductions, group statistics, KL estimators, normalisation.

Conventions: ``B`` samples, ``T`` padded response length, ``mask`` bool ``[B, T]``.
Values at masked positions are garbage by contract (NaN, 1e9): every function here
selects with ``torch.where`` before it reduces, so neither the value nor the gradient
ever sees them.  All reductions are vectorised (no Python loop over samples or tokens).

Data-parallel invariance: a reduction takes its *global* denominators explicitly
(``num_tokens``/``num_samples`` of the whole global batch), so that the sum over shards
and micro-batches of each one's contribution equals the one-process value.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

#: Groups whose reward std is at most this are "all equal" (advantage exactly 0).
ZERO_STD_TOL = 1e-6
#: GRPO's std epsilon (DeepSeekMath; Relax upstream ``STD_EPS``).
STD_EPS = 1e-6


# --------------------------------------------------------------------------- masking


def masked_fill_zero(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` where ``mask`` else 0, with no gradient (and no NaN) through masked slots."""
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` over ``mask`` (masked slots may hold NaN)."""
    z = masked_fill_zero(x, mask)
    return z.sum() if dim is None else z.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean over ``mask``; 0 where nothing is valid (never NaN)."""
    s = masked_sum(x, mask, dim)
    n = mask.sum() if dim is None else mask.sum(dim)
    return s / n.clamp(min=1).to(s.dtype)


# --------------------------------------------------------------------------- loss reductions

REDUCTIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def reduce_loss(
    loss: Tensor,
    mask: Tensor,
    mode: str,
    *,
    num_tokens: float | Tensor | None = None,
    num_samples: float | Tensor | None = None,
    tokens_per_sample: Tensor | None = None,
    norm_constant: float | None = None,
) -> Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar, shard-invariantly.

    Args:
        loss: float ``[B, T]`` per-token loss; masked slots may hold garbage (NaN, 1e9),
            which reaches neither the value nor the gradient.
        mask: bool ``[B, T]`` valid tokens (``loss_mask``).
        mode: one of :data:`REDUCTIONS` (below).
        num_tokens: valid tokens of the *global* batch (all data-parallel shards,
            context-parallel pieces and micro-batches together).  Default: ``mask.sum()``.
        num_samples: samples of the global batch (a sample split over context-parallel
            ranks counts once).  Default: ``B``.
        tokens_per_sample: ``[B]`` valid tokens of each *whole* sequence (int or float).
            Needed by ``seq-mean-token-mean`` when a sequence is split over
            context-parallel ranks, where the local ``mask.sum(-1)`` is only a piece.
            Default: ``mask.sum(-1)``.
        norm_constant: the constant of ``seq-mean-token-sum-norm`` (tokens).

    Modes, with m_it the mask, N = ``num_tokens``, M = ``num_samples``,
    n_i = ``tokens_per_sample``:

    - ``token-mean``: Σ_it m·loss / N (``--calculate-per-token-loss``).  A fully masked
      sample adds nothing to N.
    - ``seq-mean-token-mean`` (default): Σ_i (Σ_t m·loss_i / max(n_i, 1)) / M.  A fully
      masked sample adds 0 to the numerator but counts in M.
    - ``seq-mean-token-sum``: Σ_it m·loss / M.
    - ``seq-mean-token-sum-norm`` (Dr.GRPO, Liu et al. 2025 §3.1): Σ_it m·loss /
      (norm_constant · M).

    Each mode is linear in the per-token loss with global denominators, so the sum over
    shards and micro-batches of each piece's value (and gradient) equals the one-process
    value, provided every piece is given the global ``num_tokens`` / ``num_samples`` /
    ``tokens_per_sample``.  Denominators are clamped to at least 1 (never NaN).

    Example (``tests/core/test_reduce_loss.py``): sample A has 2 tokens of loss 1, B 4
    tokens of loss 3, T = 4 → 2.333333, 2.0, 7.0, 1.75 (constant 4).

    Returns:
        0-dim tensor of ``loss.dtype``.

    Raises:
        ValueError: unknown mode, ``seq-mean-token-sum-norm`` without a positive
            constant, or ``tokens_per_sample`` not of shape ``[B]``.
    """
    if mode not in REDUCTIONS:
        raise ValueError(f"unknown loss reduction {mode!r}; one of {', '.join(REDUCTIONS)}")
    mask = mask.bool()
    z = masked_fill_zero(loss, mask)  # [B, T]
    if mode == "token-mean":
        n = mask.sum() if num_tokens is None else num_tokens
        return z.sum() / _as_denominator(n, z)
    m = mask.shape[0] if num_samples is None else num_samples
    per_sample = z.sum(-1)  # [B]
    if mode == "seq-mean-token-mean":
        if tokens_per_sample is None:
            tokens_per_sample = mask.sum(-1)
        elif tokens_per_sample.shape != per_sample.shape:
            raise ValueError(f"tokens_per_sample must have shape {tuple(per_sample.shape)}, "
                             f"got {tuple(tokens_per_sample.shape)}")
        per_sample = per_sample / tokens_per_sample.to(z.dtype).clamp(min=1)
    elif mode == "seq-mean-token-sum-norm":
        if norm_constant is None or not norm_constant > 0:
            raise ValueError("seq-mean-token-sum-norm needs a positive norm_constant")
        per_sample = per_sample / norm_constant
    return per_sample.sum() / _as_denominator(m, z)


def _as_denominator(n: Any, like: Tensor) -> Tensor:
    t = torch.as_tensor(n, dtype=like.dtype, device=like.device)
    return t.clamp(min=1)


def token_metric_mean(x: Tensor, mask: Tensor, num_tokens: float | Tensor | None = None) -> Tensor:
    """Masked token mean of a per-token metric, detached (``num_tokens``: global count)."""
    return reduce_loss(x.detach().to(torch.float32), mask, "token-mean", num_tokens=num_tokens)


# --------------------------------------------------------------------------- groups


def group_ids(group_index: Tensor) -> tuple[Tensor, int]:
    """Dense ids ``[B]`` in ``0..G-1`` for arbitrary ``group_index`` values, and ``G``."""
    uniq, inv = torch.unique(group_index, return_inverse=True)
    return inv, int(uniq.numel())


def group_stats(values: Tensor, group_index: Tensor, valid: Tensor | None = None) -> dict[str, Tensor]:
    """Per-sample statistics of each sample's group (vectorised scatter, no loop).

    Args:
        values: float ``[B]`` (invalid entries may hold NaN).
        group_index: long ``[B]``; groups are identified by value, never by position.
        valid: bool ``[B]`` entries that count (default: finite values).

    Returns a dict of ``[B]`` tensors (float64 internally, cast back to ``values.dtype``):
        ``count`` valid members of the group, ``mean`` group mean over valid members,
        ``std`` unbiased (N−1) std (0 when count < 2), ``sum`` group sum.
    """
    if valid is None:
        valid = torch.isfinite(values)
    gid, g = group_ids(group_index)
    v = torch.where(valid, values, torch.zeros_like(values)).to(torch.float64)
    w = valid.to(torch.float64)
    cnt = torch.zeros(g, dtype=torch.float64, device=values.device).index_add_(0, gid, w)
    s = torch.zeros(g, dtype=torch.float64, device=values.device).index_add_(0, gid, v)
    mean = s / cnt.clamp(min=1)
    dev = torch.where(valid, v - mean[gid], torch.zeros_like(v))
    ss = torch.zeros(g, dtype=torch.float64, device=values.device).index_add_(0, gid, dev * dev)
    var = torch.where(cnt > 1, ss / (cnt - 1).clamp(min=1), torch.zeros_like(ss))
    dt = values.dtype if values.is_floating_point() else torch.float32
    return {"count": cnt[gid].to(dt), "mean": mean[gid].to(dt), "std": var.sqrt()[gid].to(dt),
            "sum": s[gid].to(dt), "group_count": cnt, "group_std": var.sqrt(), "gid": gid}


def broadcast_to_tokens(per_sample: Tensor, mask: Tensor) -> Tensor:
    """``[B]`` → ``[B, T]``, 0 at masked positions."""
    return masked_fill_zero(per_sample[:, None].expand(mask.shape).to(torch.float32), mask.bool())


# --------------------------------------------------------------------------- KL

KL_TYPES = ("k1", "k2", "k3", "low_var_kl")


def kl_estimate(log_probs: Tensor, ref_log_probs: Tensor, kind: str) -> Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from sampled tokens, in float32.

    With x = log π_θ − log π_ref (Schulman, "Approximating KL divergence", 2020):
    ``k1`` = x, ``k2`` = x²/2, ``k3`` = ``low_var_kl`` = e^(−x) − 1 + x, with x clamped to
    [−20, 20] before the exp, and ``low_var_kl`` clamped to [−10, 10].

    Values (tests): log π = −1.0, log π_ref = −1.5 → k1 0.5, k2 0.125, k3 0.106531;
    d k3/d log π = 0.393469.

    Raises:
        ValueError: unknown ``kind``.
    """
    if kind not in KL_TYPES:
        raise ValueError(f"unknown KL type {kind!r}; one of {', '.join(KL_TYPES)}")
    x = log_probs.to(torch.float32) - ref_log_probs.to(torch.float32)
    if kind == "k1":
        return x
    if kind == "k2":
        return 0.5 * x * x
    x = x.clamp(-20.0, 20.0)
    k3 = torch.exp(-x) - 1.0 + x
    if kind == "low_var_kl":
        k3 = k3.clamp(-10.0, 10.0)
    return k3


# --------------------------------------------------------------------------- distributed helpers


def all_reduce_sum(t: Tensor, group: Any = None) -> Tensor:
    """Sum over the ranks of ``group`` (identity when ``group`` is None / not initialised)."""
    if group is None:
        return t
    import torch.distributed as dist

    out = t.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


def masked_normalize(values: Tensor, mask: Tensor, *, group: Any = None, eps: float = 1e-8,
                     unbiased: bool = False) -> tuple[Tensor, dict[str, float]]:
    """Normalise token values over all valid tokens of the global batch (all DP ranks).

    Two passes: μ = Σ m·v / N, σ² = Σ m·(v − μ)² / N (population variance; ×N/(N−1) when
    ``unbiased``), output m·(v − μ)/sqrt(max(σ², eps)).  Computed in float32 (float64 for
    float64 input).  A rank with no valid tokens still joins the collectives.

    Source: REINFORCE++ (Hu et al. 2025, §3 "global advantage normalization").

    Raises:
        ValueError: when no rank has a valid token.
    """
    dt = torch.float64 if values.dtype == torch.float64 else torch.float32
    mask = mask.bool()
    v = masked_fill_zero(values.to(dt), mask)
    stats = torch.stack([v.sum(), mask.sum().to(dt)])
    stats = all_reduce_sum(stats, group)
    n = stats[1]
    if n.item() == 0:
        raise ValueError("masked_normalize: the loss mask is empty on every rank; nothing to normalise")
    mu = stats[0] / n
    d = masked_fill_zero(v - mu, mask)
    ss = all_reduce_sum((d * d).sum(), group)
    var = ss / n
    if unbiased and n.item() > 1:
        var = var * n / (n - 1)
    out = masked_fill_zero(d * torch.rsqrt(var.clamp(min=eps)), mask)
    return out, {"mean": float(mu), "var": float(var), "count": float(n)}


def is_finite_number(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
