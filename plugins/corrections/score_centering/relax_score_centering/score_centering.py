"""Score centering (SC) for off-policy REINFORCE with a top-k sampler head.

Source: "Score Centering Stabilizes Off-policy Reinforcement Learning" (arXiv:2609.20807),
eqs. (9)-(12) (derivation below); the Score centering section of the corrections guide
(``docs/guide/corrections.md``).

At a prefix h with sampler q and trainer p = p_θ, the REINFORCE gradient A·w_a·∇log p_a has
the non-zero mean A·μ_w, μ_w = Σ_v q_v w_v ∇log p_v.  SC subtracts it, leaving the
covariance.  Only the sampler's top-k head H is stored (log q_v normalised over the full
vocabulary at the sampling temperature); the tail is modelled as q̂_v = ρ·p_v (v ∉ H):

    P = Σ_H p_v,  Q = Σ_H q_v,  ρ = max(1 − Q, ε) / max(1 − P, ε)
    α = ρ·w(1/ρ)                       (p/q̂ = 1/ρ on the tail)
    w_v = w(p_v / q_v),  c_v = sg(q_v·w_v − α·p_v)    for v ∈ H
    loss_t = −A·(sg(w_a)·log p_a − Σ_H c_v·log p_v)

Because Σ_all p_v ∇log p_v = 0, ∇Σ_H c_v log p_v = E_q̂[w ∇log p] exactly.  w is the IS
rule of the TIS / ICE-POP correction selected in the same run (``CorrectionInput.is_weight``)
or w ≡ 1 (then α = ρ).  The incoming loss is the REINFORCE loss −A·sg(w_a)·log p_a (TIS /
ICE-POP applied first), so this correction adds A·Σ_H c_v·log p_v.

Glossary: q_v = exp(``top_k_log_probs``), p_v = exp(``train_top_k_log_probs``), A =
``advantages``, P/Q = trainer/sampler head mass, ρ = tail ratio, c_v = head residual.
Example: q_H = [0.5, 0.3], p_H = [0.4, 0.4], w ≡ 1 → ρ = α = 1, c = [0.1, −0.1].
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from relax_core.contracts import CorrectionInput, CorrectionOutput
from relax_core.policy import LOG_RATIO_CLAMP

#: ε of the tail masses max(1 − Q, ε), max(1 − P, ε).
EPS = 1e-6
#: Tolerances of the input checks (sampler mass Σ_H q ≤ 1 + MASS_TOL; head log-prob of the
#: sampled token vs its log-prob).
MASS_TOL = 1e-4
AGREE_TOL = 5e-3


def _ones(ratio: Tensor) -> Tensor:
    return torch.ones_like(ratio)


def head_residual(train_head_log_probs: Tensor, sampler_head_log_probs: Tensor,
                  is_weight: Any = None, eps: float = EPS) -> tuple[Tensor, Tensor, Tensor]:
    """The detached head coefficients c_v = q_v·w(p_v/q_v) − α·p_v (SC eq. 12).

    Args:
        train_head_log_probs: float ``[..., k]`` log p_v (full-vocabulary softmax; grad ignored).
        sampler_head_log_probs: float ``[..., k]`` log q_v (full-vocabulary, sampling temperature).
        is_weight: ``ratio -> weight`` rule, or ``None`` for w ≡ 1.
    Returns:
        ``(c [..., k], P [...], Q [...])`` in float32, detached.
    """
    w = is_weight if is_weight is not None else _ones
    with torch.no_grad():
        log_p = train_head_log_probs.detach().float()
        log_q = sampler_head_log_probs.detach().float()
        p, q = log_p.exp(), log_q.exp()
        P, Q = p.sum(-1), q.sum(-1)  # [...]
        rho = (1 - Q).clamp(min=eps) / (1 - P).clamp(min=eps)
        alpha = rho * w(1 / rho)
        w_v = w((log_p - log_q).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp())
        c = q * w_v - alpha[..., None] * p
    return c, P, Q


class ScoreCentering:
    """The SC correction.  ``top_k`` tells the core how wide a head the engine must return
    and that the backend must compute log p at those ids (``needs_top_k``)."""

    needs_top_k = True

    def __init__(self, top_k: int) -> None:
        if top_k < 1:
            raise ValueError(f"--score-centering-top-k must be >= 1, got {top_k}")
        self.top_k = top_k

    def apply(self, inp: CorrectionInput) -> CorrectionOutput:
        """Add A·Σ_H c_v·log p_v to the REINFORCE loss ``[B, T]``.

        Uses ``top_k_ids`` / ``top_k_log_probs`` (engine, ``[B, T, k]``) and
        ``train_top_k_log_probs`` (trainer, ``[B, T, k]``, with grad).  Metrics
        ``sc_correction`` (Σ_H c_v log p_v), ``sc_sampler_head_mass`` (Q),
        ``sc_train_head_mass`` (P), ``[B, T]``, 0 where masked.

        Raises:
            ValueError: a head is missing or has another shape; at a valid position a
                sampler head is non-finite, positive, has mass Σ q > 1, or repeats an id;
                or (when ``response_ids`` is given) the head's log-prob of the sampled token
                disagrees with ``rollout_log_probs`` or ``log_probs`` — the engine and the
                trainer must both normalise over the full vocabulary at the rollout temperature.
        """
        ids, log_q, log_p = inp.top_k_ids, inp.top_k_log_probs, inp.train_top_k_log_probs
        if ids is None or log_q is None or log_p is None:
            raise ValueError("score centering needs top_k_ids and top_k_log_probs from the engine and "
                             "train_top_k_log_probs from the backend")
        if not (ids.shape == log_q.shape == log_p.shape) or ids.shape[:2] != inp.loss.shape:
            raise ValueError(f"top-k heads must all be [B, T, k] with [B, T] = {tuple(inp.loss.shape)}; got "
                             f"{tuple(ids.shape)}, {tuple(log_q.shape)}, {tuple(log_p.shape)}")
        mask = inp.loss_mask.bool()  # [B, T]
        m3 = mask[..., None]  # [B, T, 1]
        zero = torch.zeros((), device=log_q.device)
        log_q = torch.where(m3, log_q.detach().float(), zero)  # [B, T, k]
        log_p = torch.where(m3, log_p.float(), zero)  # [B, T, k], grad
        self._check(inp, ids, log_q, log_p, mask)

        c, P, Q = head_residual(log_p, log_q, inp.is_weight)  # [B, T, k], [B, T], [B, T]
        c = torch.where(m3, c, zero)
        correction = (c * log_p).sum(-1)  # [B, T], differentiable through log p_v only
        adv = torch.where(mask, inp.advantages.detach().float(), zero)
        loss = inp.loss + (adv * correction).to(inp.loss.dtype)
        metrics = {
            "sc_correction": correction.detach(),
            "sc_sampler_head_mass": torch.where(mask, Q, zero),
            "sc_train_head_mass": torch.where(mask, P, zero),
        }
        return CorrectionOutput(loss=loss, token_metrics=metrics)

    @staticmethod
    def _check(inp: CorrectionInput, ids: Tensor, log_q: Tensor, log_p: Tensor, mask: Tensor) -> None:
        m3 = mask[..., None]
        if not torch.isfinite(log_q).all() or (log_q > MASS_TOL).any():
            raise ValueError("sampler top-k log-probs must be finite and <= 0 at every loss position")
        if ((log_q.exp().sum(-1) > 1 + MASS_TOL) & mask).any():
            raise ValueError("sampler top-k head has probability mass > 1: its log-probs are not normalised "
                             "over the full vocabulary")
        srt = ids.sort(-1).values
        if ((srt[..., 1:] == srt[..., :-1]) & m3).any():
            raise ValueError("a sampler top-k head repeats a token id")
        if inp.response_ids is None:
            return
        hit = (ids == inp.response_ids[..., None]) & m3  # [B, T, k] sampled token inside the head
        pairs = [("trainer", log_p.detach(), inp.log_probs)]
        if inp.rollout_log_probs is not None:
            pairs.append(("engine", log_q, inp.rollout_log_probs))
        for who, head, token in pairs:
            gap = torch.where(hit, (head - token.detach().float()[..., None]).abs(), torch.zeros((), device=head.device))
            if (gap > AGREE_TOL).any():
                raise ValueError(f"the {who}'s top-k log-prob of the sampled token differs from its token log-prob "
                                 f"by {float(gap.max()):.3g}: both must be normalised over the full vocabulary at "
                                 f"the rollout temperature (--rollout-temperature)")


def build(params: Any, config: Any) -> ScoreCentering:
    """Factory: ``ScoreCentering(params.top_k)``."""
    return ScoreCentering(params.top_k)
