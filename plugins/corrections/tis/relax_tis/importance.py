"""Behaviour importance ratios for train/inference mismatch corrections (TIS, ICE-POP) and
the importance-weight rules that score centering reuses.

Source: Yao et al. 2025, "On the Rollout-Training Mismatch in Modern RL Systems" (TIS);
Ling Team 2025, arXiv:2510.18855 (ICE-POP); the TIS and ICE-POP sections of the
corrections guide (``docs/guide/corrections.md``).

Glossary (per response token t): q = the rollout engine's sampling distribution
(``rollout_log_probs``), p_0 = the old policy recomputed by the trainer
(``old_log_probs``), p_θ = the current policy (``log_probs``).  The behaviour ratio is
ρ = exp(log num − log q) where the numerator is the estimator's declared
``behaviour_numerator`` (``CorrectionInput.behaviour_numerator`` names the field):

- ``old_log_probs`` (a loss with a ratio to the old policy: PPO-clip, CISPO, SAPO, GSPO...):
  num = p_0.  The estimator's ratio r = p_θ/p_0 handles the update; ρ = p_0/q corrects the
  behaviour distribution, so r·ρ = p_θ/q when unclipped.
- ``log_probs`` (no ratio, −sg(A)·log p_θ): num = sg(p_θ), the current policy detached.

Levels: ``token`` ρ_t; ``sequence`` Π_t ρ_t = exp(Σ_t log ρ_t); ``geometric``
exp(mean_t log ρ_t), the sequence values broadcast to the sample's tokens.  Example: 1000
tokens each of log-ratio −0.001 give 0.367879 (sequence) and 0.999000 (geometric).

The log-ratio is clamped to ±:data:`~relax_core.policy.LOG_RATIO_CLAMP` (20) before ``exp``
so that ratios stay finite in float32.  Everything is float32, detached, and 0 (log-ratio)
or 1 (ratio) at masked positions, whose inputs may be NaN or 1e9.
"""

from __future__ import annotations

import torch
from torch import Tensor

from relax_core import BEHAVIOUR_NUMERATORS
from relax_core.contracts import CorrectionInput
from relax_core.numerics import masked_fill_zero
from relax_core.policy import LOG_RATIO_CLAMP

LEVELS = ("token", "sequence", "geometric")


def behaviour_log_ratio(inp: CorrectionInput) -> Tensor:
    """Token log-ratio log num − log q, float32 ``[B, T]``, detached, 0 at masked positions.

    The numerator is the field ``inp.behaviour_numerator`` names, detached.

    Raises:
        ValueError: ``rollout_log_probs`` is missing, or ``behaviour_numerator`` is not one
            of :data:`relax_core.BEHAVIOUR_NUMERATORS`.
    """
    if inp.rollout_log_probs is None:
        raise ValueError("the rollout engine returned no per-token log-probs (rollout_log_probs is None)")
    if inp.behaviour_numerator not in BEHAVIOUR_NUMERATORS:
        raise ValueError(f"behaviour numerator {inp.behaviour_numerator!r} is not one of "
                         f"{', '.join(BEHAVIOUR_NUMERATORS)}")
    diff = getattr(inp, inp.behaviour_numerator).detach().float() - inp.rollout_log_probs.detach().float()
    return masked_fill_zero(diff, inp.loss_mask.bool())


def level_log_ratio(log_ratio: Tensor, loss_mask: Tensor, level: str) -> Tensor:
    """Log-ratio at ``level`` (token / sequence sum / geometric mean), ``[B, T]``,
    clamped to ±20; ``log_ratio`` must be 0 at masked positions.  Raises ``ValueError``
    for an unknown level."""
    if level == "token":
        out = log_ratio
    elif level in ("sequence", "geometric"):
        seq = log_ratio.sum(-1, keepdim=True)  # [B, 1]
        if level == "geometric":
            seq = seq / loss_mask.sum(-1, keepdim=True).clamp(min=1).to(seq.dtype)
        out = seq.expand_as(log_ratio)
    else:
        raise ValueError(f"unknown importance-ratio level {level!r}; choose one of {', '.join(LEVELS)}")
    return out.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def truncated_weight(ratio: Tensor, low: float, high: float) -> Tensor:
    """TIS: w = clip(ρ, low, high)."""
    return ratio.clamp(low, high)


def band_weight(ratio: Tensor, low: float, high: float) -> Tensor:
    """ICE-POP: w = ρ·1[low ≤ ρ ≤ high] (inclusive edges; tokens outside contribute 0)."""
    return masked_fill_zero(ratio, (ratio >= low) & (ratio <= high))


def check_bounds(low: float, high: float, who: str) -> None:
    """Raises ``ValueError`` unless ``0 <= low <= high`` and ``high > 0`` (finite)."""
    if not (0.0 <= low <= high and 0.0 < high < float("inf")):
        raise ValueError(f"{who}: need 0 <= --tis-clip-low <= --tis-clip and --tis-clip > 0 "
                         f"(got {low} and {high})")


def mismatch_metrics(inp: CorrectionInput, token_log_ratio: Tensor, ratio: Tensor, weight: Tensor) -> dict[str, Tensor]:
    """Token metrics ``[B, T]`` (float32, detached, 0 at masked positions) of an
    importance-weight correction: ``tis`` ρ, ``tis_clipfrac`` 1[w ≠ ρ], ``tis_abs`` |ρ − 1|,
    ``ois`` p_θ/p_0 (the PPO ratio), ``train_rollout_logprob_abs_diff`` |log num − log q|
    (token level).  ``token_log_ratio`` must be 0 and ``ratio``, ``weight`` finite at
    masked positions (as :func:`behaviour_log_ratio` and :func:`level_log_ratio` give them):
    they are masked by a multiply, only ``ois`` (from the raw inputs) by a select."""
    with torch.no_grad():
        mask = inp.loss_mask.bool()
        m = mask.to(torch.float32)
        ppo_log_ratio = masked_fill_zero(inp.log_probs.detach().float() - inp.old_log_probs.detach().float(), mask)
        return {
            "tis": ratio * m,
            "tis_clipfrac": (weight != ratio).to(torch.float32) * m,
            "tis_abs": (ratio - 1).abs_() * m,
            "ois": ppo_log_ratio.clamp_(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp_() * m,
            "train_rollout_logprob_abs_diff": token_log_ratio.abs(),
        }
