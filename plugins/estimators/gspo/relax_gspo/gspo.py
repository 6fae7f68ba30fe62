"""GSPO: Group Sequence Policy Optimization.

Source: Zheng et al. 2025, "Group Sequence Policy Optimization", §4.1 eq. (5)-(7).

Reward stage: as GRPO.  Policy loss: one importance ratio per sequence i, from the mean
log-ratio over its n_i valid tokens::

    KL_seq,i = (1/n_i) Σ_t m_{i,t} (log π_old(y_{i,t}) − log π_θ(y_{i,t}))
    s_i      = exp(−KL_seq,i)                         (the log is clamped to [−20, 20])
    L_{i,t}  = max(−s_i·A, −clip(s_i, 1 − ε, 1 + ε_high)·A)   (+ dual clip with --eps-clip-c)

for every valid token t of sequence i; d s_i / d log π_θ(y_{i,t}) = s_i / n_i.  Masked slots
enter neither n_i nor the sum.  The objective is a per-sequence mean (declared
``forbids_per_token_loss``), and a token's loss depends on its whole sequence
(``needs_full_sequence``, ``kl_level = "sequence"``).

Values (tests): valid log-ratios [0.1, −0.3] and a padded 5.0 → s = exp(−0.1) = 0.904837,
d s / d log π_t = 0.452419 for each valid token and 0 for the pad.

Glossary: KL_seq = ``seq_kl`` [B], s = ``seq_ratio`` [B], ε = ``--eps-clip``,
ε_high = ``--eps-clip-high``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from relax_core.config import RunConfig
from relax_core.contracts import PolicyLossInput, PolicyLossOutput
from relax_core.policy import LOG_RATIO_CLAMP, GroupMeanAdvantages, masked_advantages, ppo_clip


def sequence_log_ratio(log_probs: Tensor, old_log_probs: Tensor, loss_mask: Tensor) -> Tensor:
    """Mean over each sequence's valid tokens of log π_θ − log π_old: float32 ``[B]``
    (0 for a sequence with no valid token), clamped to [−20, 20]."""
    mask = loss_mask.bool()
    diff = torch.where(mask, log_probs.to(torch.float32) - old_log_probs.detach().to(torch.float32),
                       torch.zeros((), device=mask.device))
    n = mask.sum(-1).clamp(min=1).to(torch.float32)
    return (diff.sum(-1) / n).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def gspo_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, loss_mask: Tensor,
              eps_clip: float, eps_clip_high: float, eps_clip_c: float | None = None) -> PolicyLossOutput:
    """The GSPO per-token loss ``[B, T]`` float32 (module docstring); token metrics
    ``pg_clipfrac`` and ``ppo_kl`` (= KL_seq of the token's sequence)."""
    mask = loss_mask.bool()
    seq_log_ratio = sequence_log_ratio(log_probs, old_log_probs, mask)  # [B]
    ratio = torch.exp(seq_log_ratio)[:, None].expand(mask.shape)  # [B, T]
    A = masked_advantages(advantages, mask)
    loss, clipped = ppo_clip(ratio, A, eps_clip, eps_clip_high, eps_clip_c)
    zero = torch.zeros((), device=mask.device)
    return PolicyLossOutput(
        loss=torch.where(mask, loss, zero),
        token_metrics={"pg_clipfrac": torch.where(mask, clipped, zero),
                       "ppo_kl": torch.where(mask, -seq_log_ratio.detach()[:, None], zero)})


@dataclass(frozen=True)
class GSPO(GroupMeanAdvantages):
    """The GSPO estimator (see the module docstring)."""

    eps_clip: float = 0.2
    eps_clip_high: float = 0.2
    eps_clip_c: float | None = None

    def policy_loss(self, inp: PolicyLossInput) -> PolicyLossOutput:
        return gspo_loss(inp.log_probs, inp.old_log_probs, inp.advantages, inp.loss_mask,
                         self.eps_clip, self.eps_clip_high, self.eps_clip_c)


def build(params, config: RunConfig | None) -> GSPO:
    """Factory (``relax_gspo.gspo:build``): clip margins from ``params``."""
    return GSPO(eps_clip=params.eps_clip, eps_clip_high=params.effective_eps_clip_high, eps_clip_c=params.eps_clip_c,
                **GroupMeanAdvantages.options(params, config))
