"""GRPO: Group Relative Policy Optimization.

Source: Shao et al. 2024, "DeepSeekMath", §4.1.2 eq. (3); Dr.GRPO (no std division):
Liu et al. 2025, "Understanding R1-Zero-Like Training", §3.1; dual clip: Ye et al. 2020 eq. (5).

Reward stage (per group g of scorable samples, by ``group_index``)::

    A_i = (R_i − mean_g R) / (std_g R + 1e-6)     std unbiased (N−1)
    A_i =  R_i − mean_g R                          --disable-grpo-std-normalization

broadcast to every response token.  Policy loss per token (``--pg-loss-type ppo_clip``)::

    L_t = max(−r_t·A, −clip(r_t, 1 − ε, 1 + ε_high)·A),   r_t = π_θ(y_t)/π_old(y_t)
    L_t = min(L_t, −c·A)   for A < 0 with --eps-clip-c c > 1

or ``--pg-loss-type reinforce``: L_t = −sg(A)·log π_θ(y_t) (unclipped; for score centering).

Glossary: R = ``rewards`` [B], A = ``advantages`` [B, T], r = ratio, ε = ``eps_clip``,
ε_high = ``eps_clip_high``, c = ``eps_clip_c``.
"""

from __future__ import annotations

from dataclasses import dataclass

from relax_core.config import RunConfig
from relax_core.contracts import PolicyLossInput, PolicyLossOutput
from relax_core.policy import GroupMeanAdvantages, ppo_clip_loss, reinforce_loss


@dataclass(frozen=True)
class GRPO(GroupMeanAdvantages):
    """The GRPO estimator (see the module docstring)."""

    eps_clip: float = 0.2
    eps_clip_high: float = 0.2
    eps_clip_c: float | None = None
    pg_loss_type: str = "ppo_clip"

    def policy_loss(self, inp: PolicyLossInput) -> PolicyLossOutput:
        """Per-token loss ``[B, T]`` float32; token metrics ``pg_clipfrac``, ``ppo_kl``."""
        if self.pg_loss_type == "reinforce":
            return reinforce_loss(inp.log_probs, inp.old_log_probs, inp.advantages, inp.loss_mask)
        return ppo_clip_loss(inp.log_probs, inp.old_log_probs, inp.advantages, inp.loss_mask,
                             self.eps_clip, self.eps_clip_high, self.eps_clip_c)


def build(params, config: RunConfig | None) -> GRPO:
    """Factory (``relax_grpo.grpo:build``): ``--disable-rewards-normalization`` from the run
    config, the rest (the clip block among them) from ``params``."""
    return GRPO(eps_clip=params.eps_clip, eps_clip_high=params.effective_eps_clip_high, eps_clip_c=params.eps_clip_c,
                **GroupMeanAdvantages.options(params, config),
                pg_loss_type=params.pg_loss_type)
