"""SAPO: Soft Adaptive Policy Optimization.

Source: Qwen team 2025, "Soft Adaptive Policy Optimization"; Relax algorithms reference, SAPO.

Reward stage: as GRPO.  Policy loss per token, a smooth gate instead of a hard clip::

    τ_t  = τ_pos if A > 0 else τ_neg
    f(r) = (4/τ) · σ(τ·(r − 1))              r = π_θ(y_t)/π_old(y_t)
    L_t  = −f(r_t) · A

d f / d r = 4σ(1 − σ), which is 1 at r = 1 (the gate matches the unclipped surrogate's
gradient on policy) and decays smoothly away from it; d L / d log π = −A · 4σ(1 − σ) · r.
The log-ratio is clamped to [−20, 20] before the exp, so extreme values stay finite.

``pg_clipfrac``: tokens whose gate damps the gradient below 0.9 of the on-policy value
(4σ(1 − σ) < 0.9) on the side that matters for their advantage sign
(A > 0 ∧ r > 1, or A < 0 ∧ r < 1).

Values (tests; f, d L/d log π): r = 1, A = ±1 → (2.0, −1.0), (1.904762, +1.0);
r = 1.5, A = +1 → (2.489837, −1.410022); A = −1 → (2.393585, +1.401210);
r = 0.5, A = +1 → (1.510163, −0.470007).

Glossary: τ_pos = ``--sapo-tau-pos`` (1.0), τ_neg = ``--sapo-tau-neg`` (1.05), f = ``gate``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from relax_core.config import RunConfig
from relax_core.contracts import PolicyLossInput, PolicyLossOutput
from relax_core.policy import GroupMeanAdvantages, masked_advantages, masked_log_ratio

#: A token counts in ``pg_clipfrac`` when its gate gradient 4σ(1−σ) falls below this.
GATE_CLIP_THRESHOLD = 0.9


def sapo_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, loss_mask: Tensor,
              tau_pos: float, tau_neg: float) -> PolicyLossOutput:
    """The SAPO per-token loss ``[B, T]`` float32 (module docstring); token metrics
    ``pg_clipfrac``, ``ppo_kl``.

    Raises:
        ValueError: a temperature that is not > 0.
    """
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"SAPO temperatures must be > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    mask = loss_mask.bool()
    log_ratio = masked_log_ratio(log_probs, old_log_probs, mask)  # [B, T]
    A = masked_advantages(advantages, mask)
    ratio = torch.exp(log_ratio)
    tau = torch.where(A > 0, tau_pos, tau_neg)
    sig = torch.sigmoid(tau * (ratio - 1.0))
    gate = (4.0 / tau) * sig
    harmful_side = ((A > 0) & (log_ratio > 0)) | ((A < 0) & (log_ratio < 0))
    damped = 4.0 * sig.detach() * (1.0 - sig.detach()) < GATE_CLIP_THRESHOLD
    zero = torch.zeros((), device=ratio.device)
    return PolicyLossOutput(loss=torch.where(mask, -gate * A, zero),
                            token_metrics={"pg_clipfrac": (mask & harmful_side & damped).to(torch.float32),
                                           "ppo_kl": -log_ratio.detach()})


@dataclass(frozen=True)
class SAPO(GroupMeanAdvantages):
    """The SAPO estimator (see the module docstring)."""

    tau_pos: float = 1.0
    tau_neg: float = 1.05

    def policy_loss(self, inp: PolicyLossInput) -> PolicyLossOutput:
        return sapo_loss(inp.log_probs, inp.old_log_probs, inp.advantages, inp.loss_mask,
                         self.tau_pos, self.tau_neg)


def build(params, config: RunConfig | None) -> SAPO:
    """Factory (``relax_sapo.sapo:build``)."""
    return SAPO(tau_pos=params.tau_pos, tau_neg=params.tau_neg,
                **GroupMeanAdvantages.options(params, config))
