"""REINFORCE++-baseline: inclusive group-mean baseline, then the global token normalisation.

Source: Hu et al. 2025, "REINFORCE++: An Efficient RLHF Algorithm with Robustness to Both
Prompt and Reward Models" (arXiv 2501.03262, v9), §3 (REINFORCE++-baseline: the group mean
as baseline, then global advantage normalisation).

For sample i of group g (``group_index``) with reward R_i, valid tokens m_{i,t}::

    C_i     = R_i − mean_{j ∈ g} R_j           (inclusive mean, no std division)
    A_{i,t} = m_{i,t}·(C_i − μ)/sqrt(max(σ², 1e-8))

with μ, σ² the mean and population variance of C over every valid *token* of the global
batch (all data-parallel ranks): a longer response weighs more in the moments.  No KL in
the advantage: the KL penalty is a separate ``k2`` loss (``--use-kl-loss --kl-loss-type k2``,
applied by the core).  The actor loss is token-level PPO-clip, reduced per sample.

Glossary: C ``centred`` (per sample), μ/σ² the token moments, A ``advantages``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from relax_core.contracts import AdvantageInput, AdvantageOutput, PolicyLossInput, PolicyLossOutput
from relax_core.numerics import broadcast_to_tokens, group_advantages, masked_normalize
from relax_core.policy import ppo_clip_loss


@dataclass(frozen=True)
class ReinforcePlusPlusBaseline:
    """The REINFORCE++-baseline estimator object (see the module docstring)."""

    eps_clip: float
    eps_clip_high: float | None
    eps_clip_c: float | None

    def compute_advantages(self, inp: AdvantageInput) -> AdvantageOutput:
        """Group-mean centring, broadcast to tokens, global token normalisation over
        ``inp.process_group`` (every group must lie on one rank).

        An unscored sample (NaN reward) is left out of its group's mean and of μ, σ²; its
        tokens get advantage 0.  A group with fewer than 2 scored samples or equal rewards
        has C = 0 (its tokens still count in μ and σ²).  ``returns`` are the token values
        of C before normalisation; the output is marked ``normalized``.

        Value (tests): groups {1, 0}, {1, 1} with 1, 3, 2, 2 tokens → per-token A =
        1.889822, −1.133893, 0.377964, 0.377964.

        Raises:
            ValueError: no valid scored token on any rank (from :func:`masked_normalize`).
        """
        ga = group_advantages(inp.rewards, inp.group_index, baseline="mean")
        scored = torch.isfinite(inp.rewards)  # [B]
        mask = inp.loss_mask.bool() & scored[:, None]  # [B, T]
        centred = broadcast_to_tokens(ga.advantages, mask)  # [B, T] float32
        adv, stats = masked_normalize(centred, mask, group=inp.process_group)
        metrics = {"rollout/zero_std_group_frac": ga.zero_std_group_frac,
                   "rollout/advantage_raw_std": math.sqrt(stats["var"])}
        return AdvantageOutput(advantages=adv, returns=centred, metrics=metrics, normalized=True)

    def policy_loss(self, inp: PolicyLossInput) -> PolicyLossOutput:
        """Token-level PPO-clip (:func:`relax_core.policy.ppo_clip_loss`)."""
        return ppo_clip_loss(inp.log_probs, inp.old_log_probs, inp.advantages, inp.loss_mask,
                             self.eps_clip, self.eps_clip_high, self.eps_clip_c)


def build(params: Any, config: Any) -> ReinforcePlusPlusBaseline:
    """Factory of the ``reinforce_plus_plus_baseline`` spec: ``params`` is the clip block
    (:class:`relax_core.DualClipParams`, its only parameters)."""
    return ReinforcePlusPlusBaseline(eps_clip=params.eps_clip, eps_clip_high=params.eps_clip_high,
                                     eps_clip_c=params.eps_clip_c)
