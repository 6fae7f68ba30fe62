"""ICE-POP: band-masked importance weights.

Source: Ling Team 2025, "Every Step Evolves: Scaling Reinforcement Learning for
Trillion-Scale Thinking Model" (arXiv:2510.18855); the ICE-POP section of the
corrections guide (``docs/guide/corrections.md``).

    w_ice(ρ) = ρ · 1[L ≤ ρ ≤ U],    L = --tis-clip-low (0.5 here), U = --tis-clip (2)

with inclusive edges.  Inside the band the importance weight is kept; outside, the token
contributes 0.  The loss is **not** renormalised by the number of kept tokens (the
reduction keeps its denominators), and PPO clipping still acts on r = p_θ/p_0
independently.  Bias: E_q[w_ice f] − E_{p_0}[f] = −E_q[ρ f 1[ρ < L ∨ ρ > U]].  Where ρ = 4,
TIS gives 2 and ICE-POP 0.  ρ is the token-level behaviour ratio of
:func:`relax_tis.importance.behaviour_log_ratio` (p_0/q for PPO kinds, sg(p_θ)/q for REINFORCE).

Metrics share TIS's names; ``tis_clipfrac`` is the fraction of dropped tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from relax_core.contracts import CorrectionInput, CorrectionOutput
from relax_tis.importance import band_weight, behaviour_log_ratio, check_bounds, level_log_ratio, mismatch_metrics


class IcePop:
    """The ICE-POP correction (``apply``) and its weight rule (``is_weight``)."""

    def __init__(self, clip_low: float, clip: float) -> None:
        check_bounds(clip_low, clip, "icepop")
        self.clip_low, self.clip = clip_low, clip

    def is_weight(self, ratio: Tensor) -> Tensor:
        """w = ρ·1[L ≤ ρ ≤ U], elementwise."""
        return band_weight(ratio, self.clip_low, self.clip)

    def apply(self, inp: CorrectionInput) -> CorrectionOutput:
        """``loss [B, T]`` × sg(w) ``[B, T]`` and TIS-named metrics; raises ``ValueError``
        without rollout log-probs or for an unknown behaviour numerator."""
        log_ratio = behaviour_log_ratio(inp)  # [B, T]
        ratio = torch.exp(level_log_ratio(log_ratio, inp.loss_mask, "token"))  # [B, T]
        weight = self.is_weight(ratio)
        loss = inp.loss * weight.to(inp.loss.dtype)
        return CorrectionOutput(loss=loss, token_metrics=mismatch_metrics(inp, log_ratio, ratio, weight))


def build(params: Any, config: Any) -> IcePop:
    """Factory; raises ``ValueError`` unless 0 <= clip_low <= clip."""
    return IcePop(params.clip_low, params.clip)
