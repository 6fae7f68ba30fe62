"""GDPO: Group reward-Decoupled Normalization Policy Optimization, for runs with several rewards.

Source: Liu et al. 2026, "GDPO: Group reward-Decoupled Normalization Policy Optimization for
Multi-reward RL Optimization", arXiv 2601.05242, §3 (the advantage) and the authors' TRL
implementation (NVlabs/GDPO).  GRPO on the weighted sum Σ_k w_k r_k maps different reward
combinations to the same advantage (with two 0/1 rewards, (1, 0) and (0, 1) in one group are
indistinguishable); GDPO normalises each reward in its group first, then the sum over the batch.

Reward stage, with the ``K`` rewards of ``--reward`` (batch field ``reward_parts`` ``[B, K]``)
and their ``--reward-weights`` w_k, per group g (by ``group_index``)::

    A_k,i = (r_k,i − mean_g r_k) / (std_g r_k + 1e-6)      each reward on its own; std unbiased (N−1)
    S_i   = Σ_k w_k · A_k,i
    A_i   = (S_i − mean_B S) / (std_B S + 1e-6)            over the step's batch; std unbiased

broadcast to every response token.  A group in which reward ``k`` is constant (or has fewer
than 2 scored members) contributes ``A_k = 0`` (:func:`relax_core.numerics.group_advantages`).
A sample that any scorer did not score (NaN in ``reward_parts``) gets ``A = 0`` and is left out
of every statistic.  The epsilon is Relax's group epsilon (the authors' code uses 1e-4).

Policy loss: PPO-clip per token, as GRPO's (``--eps-clip``, ``--eps-clip-high``, ``--eps-clip-c``).

Worked values (tests), one group of 4, rewards r_1 = [1, 0, 0, 0], r_2 = [1, 1, 0, 0], weights 1, 1:
A_1 = [1.5, −0.5, −0.5, −0.5], A_2 = [0.866025, 0.866025, −0.866025, −0.866025] (÷ 0.57735),
S = [2.366025, 0.366025, −1.366025, −1.366025], std_B S = 1.776148, so
A = [1.332111, 0.206078, −0.769095, −0.769095] (without the epsilons); GRPO on
r_1 + r_2 = [2, 1, 0, 0] gives [1.305582, 0.261116, −0.783349, −0.783349].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relax_core.config import RunConfig
from relax_core.contracts import AdvantageInput, AdvantageOutput, PolicyLossInput, PolicyLossOutput
from relax_core.numerics import STD_EPS, broadcast_to_tokens, group_advantages
from relax_core.policy import ppo_clip_loss


def gdpo_advantages(parts: torch.Tensor, group_index: torch.Tensor, weights: tuple[float, ...],
                    eps: float = STD_EPS) -> tuple[torch.Tensor, float]:
    """GDPO's per-sample advantages (see the module docstring), vectorised over samples.

    Args:
        parts: float ``[B, K]`` raw rewards per scorer; NaN = unscored by that scorer.
        group_index: long ``[B]``.
        weights: ``K`` reward weights.
        eps: added to both standard deviations.

    Returns:
        ``(advantages, zero_signal_group_frac)``: float32 ``[B]`` (0 for samples with any NaN
        part), and the fraction of groups in which every reward is constant.

    Raises:
        ValueError: ``parts`` is not ``[B, K]`` with ``K == len(weights)``.
    """
    if parts.dim() != 2 or parts.shape[1] != len(weights) or parts.shape[0] != group_index.shape[0]:
        raise ValueError(f"reward_parts must be [B, {len(weights)}] (one column per --reward), got {tuple(parts.shape)}")
    p = parts.to(torch.float64)
    valid = torch.isfinite(p).all(dim=1)  # [B]
    p = torch.where(valid[:, None], p, torch.full_like(p, float("nan")))
    total = torch.zeros(p.shape[0], dtype=torch.float64)
    no_signal = None
    for k, w in enumerate(weights):  # K scorers (a handful), not samples
        g = group_advantages(p[:, k], group_index, baseline="mean", std_normalization=True, std_eps=eps)
        total += w * g.advantages.to(torch.float64)
        no_signal = g.group_no_signal if no_signal is None else no_signal & g.group_no_signal
    n = int(valid.sum())
    s = total[valid]
    mean = s.mean() if n else torch.zeros((), dtype=torch.float64)
    std = s.std() if n >= 2 else torch.zeros((), dtype=torch.float64)
    adv = torch.where(valid, (total - mean) / (std + eps), torch.zeros_like(total))
    frac = float(no_signal.sum()) / no_signal.numel() if no_signal is not None and no_signal.numel() else 0.0
    return adv.to(torch.float32), frac


@dataclass(frozen=True)
class GDPO:
    """The GDPO estimator (see the module docstring)."""

    weights: tuple[float, ...]
    eps_clip: float = 0.2
    eps_clip_high: float = 0.2
    eps_clip_c: float | None = None

    def compute_advantages(self, inp: AdvantageInput) -> AdvantageOutput:
        """Float32 ``[B, T]`` advantages from ``inp.reward_parts``, already normalised over
        the batch (``normalized``); metric ``rollout/zero_std_group_frac`` (groups where
        every reward is constant).

        Raises:
            ValueError: the batch has no ``reward_parts`` (a run with one ``--reward``;
                refused at startup) or another number of columns than weights."""
        if inp.reward_parts is None:
            raise ValueError("gdpo needs the batch field reward_parts: give --reward more than once")
        adv, frac = gdpo_advantages(inp.reward_parts, inp.group_index, self.weights)
        tokens = broadcast_to_tokens(adv, inp.loss_mask)  # [B, T]
        return AdvantageOutput(advantages=tokens, returns=tokens.clone(), normalized=True,
                               metrics={"rollout/zero_std_group_frac": frac})

    def policy_loss(self, inp: PolicyLossInput) -> PolicyLossOutput:
        """Per-token PPO-clip loss ``[B, T]`` float32; token metrics ``pg_clipfrac``, ``ppo_kl``."""
        return ppo_clip_loss(inp.log_probs, inp.old_log_probs, inp.advantages, inp.loss_mask,
                             self.eps_clip, self.eps_clip_high, self.eps_clip_c)


def build(params, config: RunConfig | None) -> GDPO:
    """Factory (``relax_gdpo.gdpo:build``): the weights from ``--reward-weights`` (1 per
    ``--reward`` by default), the clip block from ``params``."""
    from relax_core.stages.reward_mix import weights

    cfg = config or RunConfig()
    return GDPO(weights=weights(cfg), eps_clip=params.eps_clip, eps_clip_high=params.effective_eps_clip_high,
                eps_clip_c=params.eps_clip_c)
