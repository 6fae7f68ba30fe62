"""DAPO's policy objective (Yu et al. 2025, §3, eq. 8).

    Â_{i,t} = (R_i − mean_g R) / (std_g R + 1e-6)                       (group-normalised)
    r_{i,t} = π_θ(o_{i,t} | q, o_{i,<t}) / π_old(o_{i,t} | q, o_{i,<t})
    J = 1/Σ_i|o_i| · Σ_i Σ_t min(r_{i,t} Â_{i,t}, clip(r_{i,t}, 1 − ε_low, 1 + ε_high) Â_{i,t})

The 1/Σ|o_i| token-level normalisation is the core's ``token-mean`` reduction
(``--calculate-per-token-loss``, which this plugin declares it requires).  Dynamic sampling
(drop groups whose rewards are all equal) and overlong reward shaping are Relax reward
post-processors (``zero_variance_filter``, ``overlong_penalty``).

Glossary: R = ``rewards`` [B] (NaN = unscored → Â = 0), g = ``group_index``, Â =
``advantages`` [B, T], log π_θ = ``log_probs`` [B, T], log π_old = ``old_log_probs`` [B, T],
ε_low = ``clip_low``, ε_high = ``clip_high``.
"""

from __future__ import annotations

from relax_core.contracts import AdvantageInput, AdvantageOutput, PolicyLossInput, PolicyLossOutput
from relax_core.policy import group_mean_advantages, ppo_clip_loss


class DAPO:
    def __init__(self, clip_low: float, clip_high: float, normalize_rewards: bool = True):
        self.clip_low = clip_low
        self.clip_high = clip_high
        self.normalize_rewards = normalize_rewards

    def compute_advantages(self, inp: AdvantageInput) -> AdvantageOutput:
        return group_mean_advantages(inp, std_normalization=True, normalize_rewards=self.normalize_rewards)

    def policy_loss(self, inp: PolicyLossInput) -> PolicyLossOutput:
        return ppo_clip_loss(inp.log_probs, inp.old_log_probs, inp.advantages, inp.loss_mask,
                             eps_clip=self.clip_low, eps_clip_high=self.clip_high)


def build(params, config) -> DAPO:
    normalize = not getattr(config, "disable_rewards_normalization", False)
    return DAPO(params.clip_low, params.clip_high, normalize_rewards=normalize)
