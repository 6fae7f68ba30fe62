"""Truncated importance sampling (TIS).

Source: Yao et al. 2025, "On the Rollout-Training Mismatch in Modern RL Systems"; the TIS
section of the corrections guide (``docs/guide/corrections.md``).

For a fixed prefix, E_{p_0}[f] = E_q[ρ f] with ρ = p_0/q.  TIS multiplies the estimator's
per-token loss (after its own clipping) by the detached weight

    w = clip(ρ, L, U),    L = --tis-clip-low (0), U = --tis-clip (2)

trading bias E_q[(w − ρ) f] for bounded variance.  ρ's numerator is the recomputed old
policy p_0 for PPO-kind losses and the detached current policy for REINFORCE-kind losses
(:func:`relax_tis.importance.behaviour_log_ratio`); its level is token, sequence
(Π_t ρ_t) or geometric ((Π_t ρ_t)^(1/n)), see :mod:`relax_tis.importance`.

Glossary: ρ = ``ratio``, w = ``weight``, q = ``rollout_log_probs``, p_0 = ``old_log_probs``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from relax_core.contracts import CorrectionInput, CorrectionOutput
from relax_tis.importance import behaviour_log_ratio, check_bounds, level_log_ratio, mismatch_metrics, truncated_weight


class TIS:
    """The TIS correction (``apply``) and its weight rule (``is_weight``, reused by score
    centering for its head weights)."""

    def __init__(self, clip_low: float, clip: float, level: str) -> None:
        check_bounds(clip_low, clip, "tis")
        self.clip_low, self.clip, self.level = clip_low, clip, level

    def is_weight(self, ratio: Tensor) -> Tensor:
        """w = clip(ρ, L, U), elementwise on float ``ratio`` of any shape."""
        return truncated_weight(ratio, self.clip_low, self.clip)

    def apply(self, inp: CorrectionInput) -> CorrectionOutput:
        """``loss [B, T]`` × sg(w) ``[B, T]``; metrics ``tis``, ``tis_clipfrac``, ``tis_abs``,
        ``ois``, ``train_rollout_logprob_abs_diff`` (``[B, T]``, 0 where masked).

        Raises ``ValueError`` without rollout log-probs or for an unknown behaviour numerator."""
        log_ratio = behaviour_log_ratio(inp)  # [B, T] float32, detached
        ratio = torch.exp(level_log_ratio(log_ratio, inp.loss_mask, self.level))  # [B, T]
        weight = self.is_weight(ratio)  # [B, T]
        loss = inp.loss * weight.to(inp.loss.dtype)
        return CorrectionOutput(loss=loss, token_metrics=mismatch_metrics(inp, log_ratio, ratio, weight))


def build(params: Any, config: Any) -> TIS:
    """Factory: ``TIS(params.clip_low, params.clip, params.level)``; raises ``ValueError``
    unless 0 <= clip_low <= clip."""
    return TIS(params.clip_low, params.clip, params.level)
