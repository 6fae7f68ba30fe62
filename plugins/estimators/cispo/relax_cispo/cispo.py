"""CISPO: Clipped IS-weight Policy Optimization.

Source: MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
Attention", §3.1 eq. (4)-(5).

Reward stage: as GRPO (group-normalised rewards broadcast to tokens).  Policy loss::

    ŵ_t = sg(clip(r_t, 1 − ε_low, 1 + ε_high)),   r_t = π_θ(y_t)/π_old(y_t)
    L_t = −ŵ_t · sg(A) · log π_θ(y_t)             d L_t / d log π_θ = −ŵ_t·A

normalised by the total number of response tokens of the batch (token mean; declared
``requires_per_token_loss``).  Unlike PPO-clip, a clipped token keeps its gradient; only its
magnitude is bounded.  ``pg_clipfrac`` counts tokens whose weight is clipped on the side that
matters for their advantage sign: (A > 0 ∧ r > 1 + ε_high) ∨ (A < 0 ∧ r < 1 − ε_low).

Values (tests): r = 1.5, A = +1, (ε_low, ε_high) = (0.2, 0.28) → ŵ = 1.28 and
d L / d log π = −1.28; r = 0.5 → ŵ = 0.8; log π = −2, r = 1.1 → d L / d log π = −1.1.

Glossary: ε_low = ``--eps-clip`` (0.2), ε_high = ``--eps-clip-high`` (default ε_low; the spec
recommends 10), ŵ = ``weight``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from relax_core.config import RunConfig
from relax_core.contracts import PolicyLossInput, PolicyLossOutput
from relax_core.policy import GroupMeanAdvantages, masked_advantages, masked_log_ratio


def cispo_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, loss_mask: Tensor,
               eps_low: float, eps_high: float) -> PolicyLossOutput:
    """The CISPO per-token loss (module docstring).

    Args:
        log_probs: ``[B, T]`` log π_θ (with grad; float32 or bfloat16).
        old_log_probs: ``[B, T]`` log π_old.
        advantages: ``[B, T]`` A.
        loss_mask: bool ``[B, T]``.
        eps_low, eps_high: clip margins of the IS weight.

    Returns:
        float32 loss ``[B, T]`` (0 at masked positions); token metrics ``pg_clipfrac``,
        ``ppo_kl`` (= log π_old − log π_θ).
    """
    mask = loss_mask.bool()
    log_ratio = masked_log_ratio(log_probs, old_log_probs, mask).detach()  # [B, T]
    A = masked_advantages(advantages, mask)
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)  # ŵ, a constant
    logp = torch.where(mask, log_probs.to(torch.float32), torch.zeros((), device=ratio.device))
    clipped = ((A > 0) & (ratio > 1.0 + eps_high)) | ((A < 0) & (ratio < 1.0 - eps_low))
    return PolicyLossOutput(loss=-weight * A * logp,
                            token_metrics={"pg_clipfrac": (clipped & mask).to(torch.float32), "ppo_kl": -log_ratio})


@dataclass(frozen=True)
class CISPO(GroupMeanAdvantages):
    """The CISPO estimator (see the module docstring)."""

    eps_clip: float = 0.2
    eps_clip_high: float = 0.2

    def policy_loss(self, inp: PolicyLossInput) -> PolicyLossOutput:
        return cispo_loss(inp.log_probs, inp.old_log_probs, inp.advantages, inp.loss_mask,
                          self.eps_clip, self.eps_clip_high)


def build(params, config: RunConfig | None) -> CISPO:
    """Factory (``relax_cispo.cispo:build``): ``--eps-clip`` / ``--eps-clip-high`` from ``params``."""
    return CISPO(eps_clip=params.eps_clip, eps_clip_high=params.effective_eps_clip_high,
                 **GroupMeanAdvantages.options(params, config))
