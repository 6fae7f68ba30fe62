"""RLOO: REINFORCE Leave-One-Out.

Source: Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
Learning from Human Feedback in LLMs", §3.2 eq. (5); Kool et al. 2019, "Buy 4 REINFORCE
Samples, Get a Baseline for Free!".

Reward stage (per group g of G scorable samples, by ``group_index``)::

    b_i = 1/(G−1) · Σ_{j≠i} R_j,      A_i = R_i − b_i = G/(G−1) · (R_i − mean_g R)

no std division; broadcast to every response token.  Policy loss, unclipped::

    L_{i,t} = −sg(A_i) · log π_θ(y_{i,t})        d L / d log π = −A_i

reduced as a token mean over the global batch's valid tokens (``--calculate-per-token-loss``,
declared ``requires_per_token_loss``): L = −(1/N_eff) Σ_i Σ_t m_{i,t} sg(A_i) log π_{i,t}.
``pg_clipfrac`` is identically 0.  An empty response contributes no loss, but its reward
still enters the other samples' baselines.

Diagnostics (training rollouts only; omitted when a reward post-processor replaces the raw
reward signal), over the samples of *complete* groups (``--n-samples-per-prompt`` samples):

- ``rollout/rloo/baseline_mean``: mean of b_i over scorable samples;
- ``rollout/rloo/adv_abs_mean``: mean of |A_i| over samples;
- ``rollout/rloo/no_signal_frac``: fraction of valid loss tokens whose sample has A_i = 0;
- ``rollout/rloo/empty_response_frac``: fraction of samples with an empty response;
- ``rollout/rloo/zero_adv_group_frac``: fraction of complete groups whose advantages are all 0;
- ``rollout/rloo/dropped_group_frac``: fraction of observed groups left out for being incomplete.

Glossary: R = ``rewards`` [B], A = ``advantages``, b = baseline, G = scorable group size,
m = ``loss_mask``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relax_core.config import RunConfig
from relax_core.contracts import AdvantageInput, AdvantageOutput, PolicyLossInput, PolicyLossOutput
from relax_core.numerics import broadcast_to_tokens, group_advantages
from relax_core.policy import reinforce_loss


@dataclass(frozen=True)
class RLOO:
    """The RLOO estimator (see the module docstring)."""

    group_size: int = 8
    """``--n-samples-per-prompt``: a group with another size is incomplete (diagnostics)."""
    diagnostics: bool = True

    def compute_advantages(self, inp: AdvantageInput) -> AdvantageOutput:
        """Leave-one-out advantages broadcast to tokens ``[B, T]``, plus the diagnostics."""
        g = group_advantages(inp.rewards, inp.group_index, baseline="leave_one_out")
        adv = broadcast_to_tokens(g.advantages, inp.loss_mask)  # [B, T]
        metrics = {"rollout/zero_std_group_frac": g.zero_std_group_frac}
        if self.diagnostics:
            metrics.update(self._diagnostics(inp, g))
        return AdvantageOutput(advantages=adv, returns=adv.clone(), metrics=metrics)

    def _diagnostics(self, inp: AdvantageInput, g) -> dict[str, float]:
        gid, n_groups = g.gid, g.group_count.numel()
        size = torch.zeros(n_groups, dtype=torch.long, device=gid.device).index_add_(0, gid, torch.ones_like(gid))
        complete = size == self.group_size  # [G]
        keep = complete[gid]  # [B] samples of complete groups
        r = inp.rewards.to(torch.float64)
        valid = torch.isfinite(r) & keep
        # b_i = (S_g − R_i)/(G − 1) over scorable members
        gsum = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(0, gid, torch.where(valid, r, 0.0))
        cnt = g.group_count[gid]
        baseline = (gsum[gid] - torch.where(valid, r, 0.0)) / (cnt - 1).clamp(min=1)
        has_baseline = valid & (cnt >= 2)
        A = g.advantages.to(torch.float64)
        zero_adv = A == 0  # [B]
        mask = inp.loss_mask.bool() & keep[:, None]
        lengths = inp.response_lengths if inp.response_lengths is not None else inp.loss_mask.sum(-1)
        group_all_zero = torch.zeros(n_groups, dtype=torch.long, device=gid.device).index_add_(0, gid, (~zero_adv).long()) == 0

        def frac(num: torch.Tensor, den: torch.Tensor) -> float:
            d = float(den.sum())
            return float(num.sum()) / d if d else 0.0

        return {
            "rollout/rloo/baseline_mean": frac(torch.where(has_baseline, baseline, 0.0), has_baseline),
            "rollout/rloo/adv_abs_mean": frac(torch.where(keep, A.abs(), 0.0), keep),
            "rollout/rloo/no_signal_frac": frac(mask & zero_adv[:, None], mask),
            "rollout/rloo/empty_response_frac": frac(keep & (lengths == 0), keep),
            "rollout/rloo/zero_adv_group_frac": frac(complete & group_all_zero, complete),
            "rollout/rloo/dropped_group_frac": float((~complete).sum()) / n_groups if n_groups else 0.0,
        }

    def policy_loss(self, inp: PolicyLossInput) -> PolicyLossOutput:
        """−sg(A)·log π per token ``[B, T]`` float32; ``pg_clipfrac`` 0, ``ppo_kl`` reported."""
        return reinforce_loss(inp.log_probs, inp.old_log_probs, inp.advantages, inp.loss_mask)


def raw_signal_kept(config: RunConfig) -> bool:
    """Whether every selected reward post-processor keeps the raw reward signal
    (``allowed_with_strict_estimators``); unknown processors count as replacing it."""
    if not config.reward_processor:
        return True
    from relax_core.host.plugins import PluginError, default_registry

    reg = default_registry()
    try:
        return all(reg.get("reward_processor", n).spec.capabilities_for(config.params_for(n)).allowed_with_strict_estimators
                   for n in config.reward_processor)
    except PluginError:
        return False


def build(params, config: RunConfig | None) -> RLOO:
    """Factory (``relax_rloo.rloo:build``); RLOO takes no parameters of its own."""
    cfg = config if config is not None else RunConfig()
    return RLOO(group_size=cfg.n_samples_per_prompt, diagnostics=raw_signal_kept(cfg))
