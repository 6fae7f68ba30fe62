"""On-policy distillation (OPD): the teacher's per-token reverse KL as an advantage term.

Sources: Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from
Self-Generated Mistakes" (GKD), arXiv 2306.13649, §3 (the student samples, the teacher
scores its tokens; reverse KL is the divergence at β = 1 of their generalised JSD); Gu et
al. 2024, "MiniLLM: Knowledge Distillation of Large Language Models", arXiv 2306.08543, §2
(reverse KL minimised with policy gradient, per-token "rewards" log p/q); Thinking Machines
2025, "On-Policy Distillation" (blog; the Tinker cookbook's ``train_on_policy``): the
per-token reverse KL, negated, as the advantage with discount 0.  slime adds it to the
estimator's advantages the same way (``apply_opd_kl_to_advantages``, ``--opd-kl-coef``).

The student π samples ``y`` (the rollout); the teacher π_T scores every sampled token.  Per
valid token t of sample i::

    d_{i,t} = log π_old(y_{i,t} | y_{i,<t}) − log π_T(y_{i,t} | y_{i,<t})     (reverse KL, one sample)
    A_{i,t} ← A_{i,t} − β · d_{i,t}                                           (β = --opd-coef)

E_{y_t ~ π}[d_t] = KL(π(·|y_<t) ‖ π_T(·|y_<t)), so the policy gradient of the estimator's loss
with this advantage descends the sequence's reverse KL to the teacher (mode-seeking: the
student is pushed off tokens the teacher finds unlikely), with the task advantage added.

The student's log-prob is ``old_log_probs``: the log-probs of the policy that the loss's
ratio is taken against (recomputed by the trainer, which forces that forward when a teacher
is set, or the engine's under ``--use-rollout-logprobs``), detached.  d is a reward-like
term, not a loss: it is not differentiated (no gradient flows through d itself, as in GKD's
on-policy sampling, where the samples are not differentiated either); its gradient is the
estimator's policy gradient −d·∇log π_θ.  Both log-probs are at the rollout temperature.

Reduction: the metric ``opd/reverse_kl`` is the token mean of d over the valid tokens of the
step's batch, Σ m·d / Σ m (0 for a batch without valid tokens); ``opd/advantage_term_abs_mean``
the token mean of |β·d|.  Masked positions (which may hold NaN) give a term of 0.

Values (tests): log π_old = [−1, −2], log π_T = [−1.5, −0.5] with β = 0.5 → d = [0.5, −1.5],
term = [−0.25, 0.75], reverse_kl = −0.5.

Glossary: d = ``reverse_kl`` [B, T], β = ``coef``, term = ``−β·d``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from relax_core.contracts import AdvantageInput, AdvantageTerm
from relax_core.numerics import masked_fill_zero


def reverse_kl(student_log_probs: Tensor, teacher_log_probs: Tensor, loss_mask: Tensor) -> Tensor:
    """d = log π_student − log π_teacher of the sampled tokens, float32 ``[B, T]``, detached,
    0 at masked positions (whatever the inputs hold there, NaN included).

    Args:
        student_log_probs, teacher_log_probs: float ``[B, T]``, nats.
        loss_mask: bool ``[B, T]``.
    """
    d = student_log_probs.detach().float() - teacher_log_probs.detach().float()
    return masked_fill_zero(d, loss_mask.bool())


class OPD:
    """The distillation term (see the module docstring): ``advantage_term`` only (it
    declares ``advantage_term``, so the core never calls a loss ``apply``)."""

    def __init__(self, coef: float) -> None:
        if not coef > 0:
            raise ValueError(f"opd: --opd-coef must be > 0 (got {coef})")
        self.coef = coef

    def advantage_term(self, inp: AdvantageInput) -> AdvantageTerm:
        """−β·d ``[B, T]`` float32 and the batch's metrics.

        Raises:
            ValueError: ``teacher_log_probs`` is missing (no ``--teacher-model``) or
                ``old_log_probs`` is (the student's log-probs were not computed).
        """
        if inp.teacher_log_probs is None:
            raise ValueError("opd: the batch has no teacher_log_probs (set --teacher-model)")
        if inp.old_log_probs is None:
            raise ValueError("opd: the batch has no old_log_probs (the student's log-probs of its samples)")
        mask = inp.loss_mask.bool()
        d = reverse_kl(inp.old_log_probs, inp.teacher_log_probs, mask)  # [B, T]
        term = -self.coef * d
        n = mask.sum().clamp(min=1).to(torch.float32)
        return AdvantageTerm(term=term, metrics={"opd/reverse_kl": float(d.sum() / n),
                                                 "opd/advantage_term_abs_mean": float(term.abs().sum() / n)})


def build(params: Any, config: Any) -> OPD:
    """Factory of the ``opd`` correction: ``(OPDParams, RunConfig) -> OPD``."""
    return OPD(params.coef)
