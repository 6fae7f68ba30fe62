"""Shared estimator pieces: the masked log-ratio, PPO-clip (asymmetric and dual clip), the
unclipped REINFORCE loss, and the group-family advantage stage.  Estimator plugins (grpo,
gspo, m2po, ppo, reinforce++, ...) build their ``policy_loss`` from these so that every
PPO-style loss clips, counts clipped tokens and reports ``ppo_kl`` the same way.

Conventions (see :mod:`relax_core.contracts`): ``B`` samples, ``T`` padded response length,
``loss_mask`` bool ``[B, T]``; values at masked positions are garbage (NaN, 1e9) and reach
neither the value nor the gradient: every function selects the raw inputs with
:func:`~relax_core.numerics.masked_fill_zero` first (once each), after which every value is
finite and 0 (log-ratio, advantages, loss, clip indicator) at masked positions.
Everything is computed in float32 whatever the input dtype (bfloat16 log-probs are upcast;
the gradient flows back to them through the cast).

Glossary: log π_θ = ``log_probs`` (current policy, with grad), log π_old = ``old_log_probs``
(detached), A = ``advantages`` (detached), r = π_θ/π_old = ``ratio``,
``ppo_kl`` = log π_old − log π_θ = −log r (per token).

Metrics returned in ``token_metrics`` (``[B, T]``, reduced by the core as a masked token
mean and logged as ``train/<name>``):

- ``pg_clipfrac``: 1 where clipping binds *for the token's advantage sign*, i.e. where the
  clipped branch is the one selected and its gradient is zero: (A > 0 ∧ r > 1 + ε_high) ∨
  (A < 0 ∧ r < 1 − ε_low), plus (A < 0 ∧ r > c) under dual clip.  Example (tests):
  r = [0.5, 0.5, 1.5, 1.5], A = [+1, −1, −1, +1], ε = 0.2 → [0, 1, 0, 1], mean 0.5.
- ``ppo_kl``: log π_old − log π_θ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import torch
from torch import Tensor

from relax_core.contracts import AdvantageInput, AdvantageOutput, PolicyLossOutput
from relax_core.numerics import broadcast_to_tokens, group_advantages, masked_fill_zero

#: The log-ratio is clamped to [−LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before ``exp`` so that
#: the ratio and its gradient stay finite in float32 (e^20 ≈ 4.9e8).  Beyond the clamp the
#: token's gradient is zero.
LOG_RATIO_CLAMP = 20.0

Bound = Union[float, Tensor]


def masked_log_ratio(log_probs: Tensor, old_log_probs: Tensor, loss_mask: Tensor) -> Tensor:
    """log r = log π_θ − log π_old, float32 ``[B, T]``, 0 at masked positions, clamped to
    [−20, 20] (:data:`LOG_RATIO_CLAMP`).  Differentiable w.r.t. ``log_probs``.

    Args:
        log_probs: float ``[B, T]`` log π_θ (any float dtype; with grad).
        old_log_probs: float ``[B, T]`` log π_old (treated as a constant).
        loss_mask: bool ``[B, T]``.
    """
    diff = log_probs.to(torch.float32) - old_log_probs.detach().to(torch.float32)
    return masked_fill_zero(diff, loss_mask.bool()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def ppo_clip(ratio: Tensor, advantages: Tensor, eps_low: Bound, eps_high: Bound,
             eps_clip_c: float | None = None) -> tuple[Tensor, Tensor]:
    """The PPO clipped surrogate per token (Schulman et al. 2017, eq. 7), with asymmetric
    bounds (DAPO "clip-higher", Yu et al. 2025 §3.1) and the dual clip for negative
    advantages (Ye et al. 2020, "Mastering Complex Control in MOBA Games", eq. 5)::

        L = max(−r·A, −clip(r, 1 − ε_low, 1 + ε_high)·A)
        L = min(L, −c·A)          where A < 0, when c = eps_clip_c is given (c > 1)

    Args:
        ratio: float32 ``[B, T]`` r (with grad), finite.
        advantages: float32 ``[B, T]`` A (detached), finite.
        eps_low, eps_high: clip margins (floats or 0-dim tensors, ≥ 0).
        eps_clip_c: dual-clip constant c > 1, or ``None`` for no dual clip.

    Returns:
        ``(loss, clipped)``: float32 ``[B, T]`` per-token loss, and the float32 0/1
        indicator of tokens where clipping binds (see the module docstring).  Positions
        are not masked here; callers mask.

    Raises:
        ValueError: ``eps_clip_c`` given and not > 1.
    """
    A = advantages
    lo, hi = 1.0 - eps_low, 1.0 + eps_high
    clamped = torch.clamp(ratio, lo, hi)
    loss = torch.maximum(-A * ratio, -A * clamped)
    # (A > 0 ∧ r > hi) ∨ (A < 0 ∧ r < lo) in one comparison: r − clip(r) is > 0 above the
    # band, < 0 below it and exactly 0 inside (|A·(r − clip(r))| would have to underflow
    # below 1e-45 to miss a clipped token)
    clipped = A * (ratio - clamped) > 0
    if eps_clip_c is not None:
        if not eps_clip_c > 1.0:
            raise ValueError(f"dual clip needs eps_clip_c > 1, got {eps_clip_c}")
        neg = A < 0
        loss = torch.where(neg, torch.minimum(loss, -eps_clip_c * A), loss)
        clipped = clipped | (neg & (ratio > eps_clip_c))
    return loss, clipped.to(torch.float32)


def ppo_clip_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, loss_mask: Tensor,
                  eps_clip: float, eps_clip_high: float | None = None,
                  eps_clip_c: float | None = None) -> PolicyLossOutput:
    """Token-level PPO-clip policy loss (GRPO, PPO, REINFORCE++ ...).

    r_t = exp(log π_θ − log π_old) per token; L_t = :func:`ppo_clip` with
    ε_low = ``eps_clip``, ε_high = ``eps_clip_high`` (default ``eps_clip``), optional dual
    clip ``eps_clip_c``.

    Args:
        log_probs: ``[B, T]`` log π_θ (with grad; float32 or bfloat16).
        old_log_probs: ``[B, T]`` log π_old.
        advantages: ``[B, T]`` A (detached inside).
        loss_mask: bool ``[B, T]``.
        eps_clip, eps_clip_high, eps_clip_c: ``--eps-clip``, ``--eps-clip-high``,
            ``--eps-clip-c``.

    Returns:
        :class:`PolicyLossOutput` with float32 ``loss`` ``[B, T]`` (0 at masked positions)
        and ``token_metrics`` ``pg_clipfrac``, ``ppo_kl``.

    Raises:
        ValueError: ``eps_clip_c`` given and not > 1.
    """
    mask = loss_mask.bool()
    log_ratio = masked_log_ratio(log_probs, old_log_probs, mask)  # 0 at masked positions
    A = masked_advantages(advantages, mask)  # 0 at masked positions
    high = eps_clip if eps_clip_high is None else eps_clip_high
    # with A = 0 and r = 1 at masked positions, the loss and the clip indicator are 0 there
    # without another masking pass
    loss, clipped = ppo_clip(torch.exp(log_ratio), A, eps_clip, high, eps_clip_c)
    return PolicyLossOutput(loss=loss, token_metrics={"pg_clipfrac": clipped, "ppo_kl": -log_ratio.detach()})


def reinforce_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor,
                   loss_mask: Tensor) -> PolicyLossOutput:
    """Unclipped REINFORCE loss L_t = −sg(A_t)·log π_θ(y_t) (Williams 1992; RLOO: Ahmadian
    et al. 2024, eq. 4).  d L_t / d log π_θ = −A_t exactly; no ratio, no clipping, so
    ``pg_clipfrac`` is identically 0.  ``old_log_probs`` only feeds the ``ppo_kl`` metric.

    Args and returns as :func:`ppo_clip_loss` (no clip parameters).
    """
    mask = loss_mask.bool()
    A = masked_advantages(advantages, mask)
    logp = _mask(log_probs.to(torch.float32), mask)
    log_ratio = masked_log_ratio(log_probs.detach(), old_log_probs, mask)
    return PolicyLossOutput(loss=-A * logp,
                            token_metrics={"pg_clipfrac": torch.zeros_like(logp.detach()),
                                           "ppo_kl": -log_ratio})


def masked_advantages(advantages: Tensor, loss_mask: Tensor) -> Tensor:
    """Advantages as a detached float32 ``[B, T]`` constant, 0 at masked positions."""
    return _mask(advantages.detach().to(torch.float32), loss_mask.bool())


def _mask(x: Tensor, mask: Tensor) -> Tensor:
    return masked_fill_zero(x, mask)


# --------------------------------------------------------------------------- advantage stage


def group_mean_advantages(inp: AdvantageInput, *, std_normalization: bool,
                          normalize_rewards: bool = True) -> AdvantageOutput:
    """The GRPO-family advantage stage (grpo, gspo, sapo, cispo): group-relative rewards
    (:func:`relax_core.numerics.group_advantages` with ``baseline="mean"``) broadcast to
    every valid token; ``returns`` is a copy of the advantages.

    Args:
        inp: the whole step's batch; every group must be complete in it (the statistics
            are per group, so ``inp.process_group`` is not needed and not used).
        std_normalization: divide by the group std + 1e-6 (GRPO) or not (Dr.GRPO,
            ``--disable-grpo-std-normalization``).
        normalize_rewards: ``False`` under ``--disable-rewards-normalization``: the raw
            rewards are broadcast (:func:`raw_reward_advantages`).

    Returns:
        float32 ``[B, T]`` advantages (0 at masked positions and for unscored samples), and
        the metric ``rollout/zero_std_group_frac`` when rewards are normalised.
    """
    if not normalize_rewards:
        return raw_reward_advantages(inp)
    g = group_advantages(inp.rewards, inp.group_index, baseline="mean", std_normalization=std_normalization)
    adv = broadcast_to_tokens(g.advantages, inp.loss_mask)  # [B, T]
    return AdvantageOutput(advantages=adv, returns=adv.clone(),
                           metrics={"rollout/zero_std_group_frac": g.zero_std_group_frac})


@dataclass(frozen=True, kw_only=True)
class GroupMeanAdvantages:
    """The group-mean advantage stage as a base of an estimator's dataclass (grpo, gspo,
    sapo, cispo): ``@dataclass(frozen=True) class MyEstimator(GroupMeanAdvantages)`` gets
    :meth:`compute_advantages`, and its factory passes :meth:`options`.

    Attributes:
        std_normalization: divide by the group std (``False``: Dr.GRPO).
        normalize_rewards: ``False`` under ``--disable-rewards-normalization``.
    """

    std_normalization: bool = True
    normalize_rewards: bool = True

    def compute_advantages(self, inp: AdvantageInput) -> AdvantageOutput:
        """Group-normalised rewards broadcast to tokens, float32 ``[B, T]``; metric
        ``rollout/zero_std_group_frac`` (:func:`group_mean_advantages`)."""
        return group_mean_advantages(inp, std_normalization=self.std_normalization,
                                     normalize_rewards=self.normalize_rewards)

    @staticmethod
    def options(params: Any, config: Any = None) -> dict[str, bool]:
        """The block's fields from an estimator's parameters (a
        :class:`~relax_core.specs.GroupAdvantageParams`) and the run config
        (``--disable-rewards-normalization``; ``None``: the defaults)."""
        normalize = config is None or not config.disable_rewards_normalization
        return {"std_normalization": not params.disable_grpo_std_normalization, "normalize_rewards": normalize}


def raw_reward_advantages(inp: AdvantageInput) -> AdvantageOutput:
    """Raw sample rewards broadcast to every valid token, no baseline (M2PO; any estimator
    under ``--disable-rewards-normalization``).  Unscored (NaN) rewards give 0."""
    r = inp.rewards.to(torch.float32)
    r = torch.where(torch.isfinite(r), r, torch.zeros((), dtype=r.dtype, device=r.device))
    adv = broadcast_to_tokens(r, inp.loss_mask)  # [B, T]
    return AdvantageOutput(advantages=adv, returns=adv.clone())
