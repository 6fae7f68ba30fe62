"""Shared numerics: masked reductions, group statistics, KL estimators, normalisation.

Conventions: ``B`` samples, ``T`` padded response length, ``mask`` bool ``[B, T]``.
Values at masked positions are garbage by contract (NaN, 1e9): every function here
selects with :func:`masked_fill_zero` (``torch.where(mask, x, 0)``) before it reduces, so
neither the value nor the gradient ever sees them.  All reductions are vectorised (no Python loop over samples or tokens).

Data-parallel invariance: a reduction takes its *global* denominators explicitly
(``num_tokens``/``num_samples`` of the whole global batch), so that the sum over shards
and micro-batches of each one's contribution equals the one-process value.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

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
    n = mask.count_nonzero() if dim is None else mask.sum(dim)  # count_nonzero: 8x a bool sum on CPU
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
        n = mask.count_nonzero() if num_tokens is None else num_tokens
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
    """Masked token mean Σ m·x / N of a per-token metric, detached, float32 0-dim.

    Args:
        x: ``[B, T]`` metric; **finite at masked positions** (their values are ignored), as
            the token-metric contract asks, so one multiply-and-sum pass suffices (no
            ``where``).
        mask: bool ``[B, T]``, or the same mask as float32 0/1 (computed once by a caller
            that reduces several metrics).
        num_tokens: N, the global batch's valid tokens (default: the mask's count).
    """
    with torch.no_grad():
        m = mask.to(torch.float32)
        s = (x.detach().to(torch.float32) * m).sum()
        return s / _as_denominator(m.sum() if num_tokens is None else num_tokens, s)


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


class GroupAdvantages(NamedTuple):
    """Result of :func:`group_advantages` (``B`` samples, ``G`` groups)."""

    advantages: Tensor
    """float32 ``[B]`` per-sample advantage (0 for unscored samples and no-signal groups)."""
    gid: Tensor
    """long ``[B]`` dense group id ``0..G-1`` of each sample."""
    group_count: Tensor
    """float64 ``[G]`` scorable (finite-reward) members of each group."""
    group_no_signal: Tensor
    """bool ``[G]`` groups whose advantages are all 0: fewer than 2 scorable members, or
    reward std ≤ :data:`ZERO_STD_TOL` (all equal)."""

    @property
    def zero_std_group_frac(self) -> float:
        """Fraction of groups with no signal (``rollout/zero_std_group_frac``); 0 if no group."""
        n = self.group_no_signal.numel()
        return float(self.group_no_signal.sum()) / n if n else 0.0


def group_advantages(rewards: Tensor, group_index: Tensor, *, baseline: str,
                     std_normalization: bool = False, std_eps: float = STD_EPS) -> GroupAdvantages:
    """Group-relative scalar advantages, vectorised (scatter over ``group_index``).

    With the scorable members R_1..R_G of a group (finite rewards; NaN = the scorer
    returned ``None``), mean R̄ and unbiased std s (N−1):

    - ``baseline="mean"``: A_i = R_i − R̄, divided by (s + ``std_eps``) when
      ``std_normalization`` (GRPO, Shao et al. 2024 §4.1.2; without it Dr.GRPO, Liu et al.
      2025 §3.1).
    - ``baseline="leave_one_out"``: A_i = R_i − mean_{j≠i} R_j = G/(G−1)·(R_i − R̄), no std
      (RLOO, Ahmadian et al. 2024 eq. 5).

    Unscored samples get 0 and are excluded from their group's statistics; a group with
    fewer than 2 scorable members, or whose std is ≤ :data:`ZERO_STD_TOL`, gets exactly 0
    (never NaN).  Statistics in float64, result float32.

    Values (tests): [1, 0, 0, 0] → [1.499997, −0.499999 ×3] (std on), [0.75, −0.25 ×3]
    (std off), [1, −1/3 ×3] (leave-one-out); [1, NaN, 0, 0] → [1.154699, 0, −0.577349 ×2].

    Args:
        rewards: float ``[B]``, NaN where unscored.
        group_index: long ``[B]``.

    Raises:
        ValueError: unknown ``baseline``, or shapes that are not both ``[B]``.
    """
    if baseline not in ("mean", "leave_one_out"):
        raise ValueError(f"unknown group baseline {baseline!r}; 'mean' or 'leave_one_out'")
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise ValueError(f"rewards and group_index must both be [B], got {tuple(rewards.shape)} and {tuple(group_index.shape)}")
    r = rewards.to(torch.float64)
    valid = torch.isfinite(r)
    st = group_stats(r, group_index, valid)
    gid, count, std = st["gid"], st["group_count"], st["group_std"]
    no_signal = (count < 2) | (std <= ZERO_STD_TOL)  # [G]
    centred = r - st["mean"]
    if baseline == "leave_one_out":
        n = st["count"]
        adv = centred * n / (n - 1).clamp(min=1)
    elif std_normalization:
        adv = centred / (st["std"] + std_eps)
    else:
        adv = centred
    keep = valid & ~no_signal[gid]
    adv = torch.where(keep, adv, torch.zeros_like(adv)).to(torch.float32)
    return GroupAdvantages(adv, gid, count, no_signal)


# --------------------------------------------------------------------------- KL

KL_TYPES = ("k1", "k2", "k3", "low_var_kl")
#: x = log π − log π_ref is clamped to this range before the exponential of k3/low_var_kl.
KL_LOG_RATIO_CLAMP = 20.0
#: ``low_var_kl`` is clamped to [−10, 10] (Relax upstream ``compute_approx_kl``).
LOW_VAR_KL_CLAMP = 10.0


def kl_estimate(log_probs: Tensor, ref_log_probs: Tensor, kind: str, *, mask: Tensor | None = None) -> Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from the sampled tokens, in float32.

    With x = log π_θ − log π_ref (Schulman, "Approximating KL divergence", 2020):

    - ``k1`` = x (unbiased, signed);
    - ``k2`` = x²/2;
    - ``k3`` = e^(−x) − 1 + x (unbiased, ≥ 0), with x clamped to [−20, 20] first (the
      gradient is 0 beyond the clamp);
    - ``low_var_kl`` = k3 clamped to [−10, 10].

    The KL loss of ``--use-kl-loss --kl-loss-coef c --kl-loss-type K`` is
    ``c * reduce_loss(kl_estimate(log_probs, ref_log_probs, K, mask=loss_mask), loss_mask, mode)``
    with the run's reduction and global denominators; REINFORCE++ uses ``k1`` of
    (log π_old, log π_ref) as its reward-side KL.

    Args:
        log_probs: float ``[...]`` log π_θ of the sampled tokens (nats; may require grad).
        ref_log_probs: float ``[...]`` log π_ref (nats; same shape).
        kind: one of :data:`KL_TYPES`.
        mask: optional bool ``[...]``; where it is False the output is 0 and neither the
            value nor the gradient sees the inputs (they may hold NaN or 1e9).

    Returns:
        float32 ``[...]`` (nats).

    Values (``tests/core/test_kl.py``): log π = −1.0, log π_ref = −1.5 → k1 0.5, k2 0.125,
    k3 0.106531; d/d log π: k1 1, k2 0.5, k3 0.393469.  At (−100, 0) every kind is finite
    in value and gradient.

    Raises:
        ValueError: unknown ``kind``, or shapes that differ.
    """
    if kind not in KL_TYPES:
        raise ValueError(f"unknown KL type {kind!r}; one of {', '.join(KL_TYPES)}")
    if log_probs.shape != ref_log_probs.shape:
        raise ValueError(f"log_probs {tuple(log_probs.shape)} and ref_log_probs "
                         f"{tuple(ref_log_probs.shape)} must have the same shape")
    x = log_probs.to(torch.float32) - ref_log_probs.to(torch.float32)
    if mask is not None:
        x = masked_fill_zero(x, mask.bool())  # before any non-linearity: no NaN gradient
    if kind == "k1":
        kl = x
    elif kind == "k2":
        kl = 0.5 * x * x
    else:
        x = x.clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
        kl = torch.expm1(-x) + x  # e^(−x) − 1 + x; expm1 keeps it ≥ 0 near x = 0 in float32
        if kind == "low_var_kl":
            kl = kl.clamp(-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)
    return kl if mask is None else masked_fill_zero(kl, mask.bool())


# --------------------------------------------------------------------------- returns


def discounted_cumsum(x: Tensor, discount: float, *, chunk: int = 32) -> Tensor:
    """Reverse discounted cumulative sum along the last dim: y_t = Σ_{u≥t} discount^(u−t) x_u.

    The recurrence y_t = x_t + discount·y_{t+1} (y_T = 0) of returns and of GAE
    (Schulman et al. 2016, eq. 16).  discount = 1: a reversed ``cumsum``.  Otherwise a
    chunked scan: inside each chunk of ``chunk`` positions a matrix product with
    M[i, j] = discount^(j−i) (j ≥ i), then the carry between chunks by the same scan over
    the chunks' first entries with discount^chunk (recursively).  No Python loop over
    positions; powers never exceed ``chunk`` so nothing overflows for discount < 1.
    Accuracy in float32 (tests, T = 8192 against a float64 loop): within 16·eps of the
    largest |partial sum| (6e-7 at discount 0.98 with |y| ≤ 0.9, 3e-5 at 0.9999 with |y| ≤ 28,
    6e-6 at 1 with |y| ≤ 41).

    Args:
        x: float ``[..., T]`` (the output keeps x's dtype).
        discount: in [0, 1].
        chunk: positions per chunk (≥ 2; the recursion depth is log_chunk(T); 32 is the
            fastest of 16–128 at T = 1024 on one CPU thread).

    Returns:
        ``[..., T]`` of x's dtype.

    Raises:
        ValueError: discount outside [0, 1] or chunk < 2.
    """
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must be in [0, 1], got {discount}")
    if chunk < 2:
        raise ValueError(f"chunk must be >= 2, got {chunk}")
    t = x.shape[-1]
    if t == 0:
        return x.clone()
    if discount == 1.0:  # a reversed cumsum: each y_t sums only its own suffix (no cancellation against the prefix)
        return x.flip(-1).cumsum(-1).flip(-1)
    k = min(chunk, t)
    n = -(-t // k)
    padded = x if n * k == t else torch.nn.functional.pad(x, (0, n * k - t))
    xc = padded.reshape(*x.shape[:-1], n, k)  # [..., n, k]
    pos = torch.arange(k, device=x.device)
    e = pos[None, :] - pos[:, None]  # [k, k] j − i
    d = torch.tensor(discount, dtype=x.dtype, device=x.device)
    m = torch.where(e >= 0, d ** e.clamp(min=0).to(x.dtype), torch.zeros((), dtype=x.dtype, device=x.device))
    local = xc @ m.T  # [..., n, k]: Σ_{j≥i in chunk} d^(j−i) x_j
    if n > 1:
        heads = discounted_cumsum(local[..., 0], discount ** k, chunk=chunk)  # [..., n] y at chunk starts
        nxt = torch.nn.functional.pad(heads[..., 1:], (0, 1))  # [..., n] y at the next chunk's start
        local = local.addcmul_(nxt[..., None], d ** (k - pos).to(x.dtype))  # carry d^(k−i)·y_next
    return local.reshape(*x.shape[:-1], n * k)[..., :t]


def last_valid_index(mask: Tensor) -> Tensor:
    """Position of the last True of each row of ``mask``.

    Args:
        mask: bool ``[B, T]`` with T ≥ 1.

    Returns:
        long ``[B]``; T − 1 on a row with no True (callers mask that row's outputs).

    Raises:
        TypeError: ``mask`` is not bool (its bytes are read as 0/1).
    """
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be bool, got {mask.dtype}")
    return mask.shape[-1] - 1 - mask.flip(-1).view(torch.uint8).argmax(-1)


# --------------------------------------------------------------------------- distributed helpers


def all_reduce_sum(t: Tensor, group: Any = None) -> Tensor:
    """Sum over the ranks of ``group`` (identity when ``group`` is None)."""
    if group is None:
        return t
    import torch.distributed as dist

    out = t.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


def masked_normalize(values: Tensor, mask: Tensor, *, group: Any = None, eps: float = 1e-8,
                     unbiased: bool = False) -> tuple[Tensor, dict[str, float]]:
    """Normalise token values over every valid token of the global batch (all DP ranks).

    Two passes, each one all-reduce over ``group``: μ = Σ m·v / N, then
    σ² = Σ m·(v − μ)² / N (population variance; ×N/(N−1) when ``unbiased`` and N > 1);
    output m·(v − μ)/sqrt(max(σ², eps)).  Every rank gets the same μ and σ², so the result
    does not depend on how the batch is sharded.  Computed in float32 (float64 for float64
    input).  A rank with no valid token still joins both collectives (it must: they are
    collective calls) and returns zeros.

    Source: REINFORCE++ (Hu et al. 2025, "REINFORCE++", §3, global advantage
    normalisation); Relax upstream ``distributed_masked_normalize``.

    Args:
        values: float ``[B, T]`` (masked slots may hold NaN or 1e9: they reach neither the
            statistics, the output nor the gradient).
        mask: bool ``[B, T]`` valid tokens.
        group: ``torch.distributed`` process group of the data-parallel ranks, or None
            (this process holds the whole batch).
        eps: floor of the variance.
        unbiased: Bessel's correction N/(N−1).

    Returns:
        ``(normalised [B, T] float32/float64 with 0 at masked slots, {"mean": μ,
        "var": σ², "count": N})`` (python floats, identical on every rank).

    Example (``tests/core/test_normalize.py``, 2 ranks): rank 0 [1, 1e4 (masked), 3], rank
    1 [−1, 5] → μ = 2, σ² = 5; rank 0 [−1, 0, 1]/√5, rank 1 [−3, 3]/√5.

    Raises:
        ValueError: when no rank has a valid token (raised on every rank alike).
    """
    dt = torch.float64 if values.dtype == torch.float64 else torch.float32
    mask = mask.bool()
    v = masked_fill_zero(values.to(dt), mask)
    stats = all_reduce_sum(torch.stack([v.sum(), mask.count_nonzero().to(dt)]), group)
    n = stats[1].detach()  # the token count (no gradient path)
    if n.item() == 0:
        raise ValueError("masked_normalize: the loss mask is empty on every rank; nothing to normalise")
    mu = stats[0] / n
    d = masked_fill_zero(v - mu, mask)
    var = all_reduce_sum((d * d).sum(), group) / n
    if unbiased and n.item() > 1:
        var = var * n / (n - 1)
    out = masked_fill_zero(d * torch.rsqrt(var.clamp(min=eps)), mask)
    return out, {"mean": float(mu.detach()), "var": float(var.detach()), "count": float(n)}


def is_finite_number(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
