"""Evaluation metrics of one evaluation set: pass@k, maj@k, their standard errors, rewards,
lengths and truncation.  ``relax eval`` (:mod:`cli.eval`) and the in-training
evaluation (``--eval-interval``, :meth:`relax_core.stages.rollout.Rollout.evaluate`) both use them.

The unit of every interval is the **prompt**: a metric is first computed per prompt (its
``n`` samples together), then averaged over the ``P`` prompts; its standard error is the
sample standard deviation of the per-prompt values over ``sqrt(P)``, and the 95 % interval
is ``mean ± 1.96 · se`` (normal approximation, not clipped to [0, 1]).  Samples of one prompt
are not independent draws of the population of problems, so they are never the unit.

Glossary: ``P`` prompts, ``n`` samples per prompt, ``c`` correct samples of a prompt, ``k``
the number of attempts the metric allows.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import torch

#: A sample counts as correct when its reward is at least this (a scorer gives 1 for a
#: correct answer; the small slack absorbs float noise).
CORRECT_REWARD = 1.0 - 1e-6
#: The two-sided 95 % quantile of the standard normal distribution.
Z95 = 1.959963984540054


@dataclass(frozen=True)
class Estimate:
    """A metric over the prompts of a set: ``mean``, its standard error ``se`` (NaN with
    fewer than two prompts), and the 95 % interval ``(low, high) = mean ± 1.96 · se``."""

    mean: float
    se: float

    @property
    def low(self) -> float:
        return self.mean - Z95 * self.se

    @property
    def high(self) -> float:
        return self.mean + Z95 * self.se

    def as_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "se": self.se, "ci95_low": self.low, "ci95_high": self.high}


def estimate(per_prompt: torch.Tensor) -> Estimate:
    """Mean and standard error of per-prompt values.

    Args:
        per_prompt: float ``[P]``, one value per prompt (NaN entries are left out).

    Returns:
        :class:`Estimate` with ``mean = Σ x / P`` and ``se = s / sqrt(P)``, ``s`` the sample
        standard deviation (``P - 1`` in the denominator); ``se`` is NaN for ``P < 2`` and
        both are NaN for ``P = 0``.
    """
    x = per_prompt.double()
    x = x[~torch.isnan(x)]
    p = x.numel()
    if p == 0:
        return Estimate(math.nan, math.nan)
    se = float(x.std(correction=1) / math.sqrt(p)) if p > 1 else math.nan
    return Estimate(float(x.mean()), se)


def pass_at_k(n: torch.Tensor, c: torch.Tensor, k: int) -> torch.Tensor:
    """Unbiased pass@k of each prompt: the probability that at least one of ``k`` samples
    drawn without replacement from the ``n`` generated is correct,
    ``1 − C(n−c, k) / C(n, k)``.

    Computed in the stable product form of Chen et al. 2021, "Evaluating Large Language
    Models Trained on Code" (arXiv:2107.03374, section 2.1 and its numpy listing):
    ``C(n−c, k) / C(n, k) = Π_{i=n−c+1}^{n} (1 − k / i)``, which never forms a binomial
    coefficient; it is exactly 0 (pass@k = 1) when ``n − c < k``.  Example: ``n = 10, c = 3``
    gives pass@1 = 0.3 and pass@5 = 1 − (3/8)(4/9)(1/2) = 1 − 21/252 = 0.916667.

    Args:
        n: long ``[P]``, samples per prompt.
        c: long ``[P]``, correct samples per prompt (``0 <= c <= n``).
        k: attempts, ``1 <= k <= min(n)``.

    Returns:
        float64 ``[P]`` in [0, 1].

    Raises:
        ValueError: ``k`` outside ``[1, min(n)]`` or ``c`` outside ``[0, n]``.
    """
    n, c = n.long(), c.long()
    if n.numel() == 0:
        return torch.zeros(0, dtype=torch.float64)
    if k < 1 or k > int(n.min()):
        raise ValueError(f"pass@{k} needs 1 <= k <= the samples per prompt ({int(n.min())})")
    if bool((c < 0).any() | (c > n).any()):
        raise ValueError("pass@k: the correct counts must lie in [0, n]")
    i = torch.arange(1, int(n.max()) + 1, dtype=torch.float64)  # [N]
    in_product = (i[None, :] > (n - c)[:, None]) & (i[None, :] <= n[:, None])  # [P, N]
    factor = torch.where(in_product, 1.0 - k / i[None, :], torch.ones((), dtype=torch.float64))  # [P, N]
    return 1.0 - factor.clamp(min=0.0).prod(dim=1)


def majority_correct(answers: Sequence[Sequence[str | None]], correct: torch.Tensor, k: int) -> torch.Tensor:
    """maj@k of each prompt: whether the most frequent extracted answer among its first
    ``k`` samples is a correct one (self-consistency, Wang et al. 2022, arXiv:2203.11171).

    Votes go to extracted answers, compared as text after stripping surrounding white
    space; samples without an answer (``None``) do not vote, and a prompt where none of
    the ``k`` has one scores 0.  **Ties**: among the answers with the most votes, the one
    that occurs first in sample order wins (deterministic, and the same as the
    first-come rule of ``collections.Counter.most_common``).  The winning answer is
    correct when the first sample that gave it is correct.

    Args:
        answers: ``P`` lists of at least ``k`` extracted answers (``None``: no answer).
        correct: bool ``[P, n]``, whether each sample is correct.
        k: the number of samples that vote, ``1 <= k <= n``.

    Returns:
        float64 ``[P]`` of 0/1.

    Raises:
        ValueError: ``k`` outside ``[1, n]``.
    """
    if correct.dim() != 2 or not 1 <= k <= correct.shape[1]:
        raise ValueError(f"maj@{k} needs 1 <= k <= the samples per prompt ({correct.shape[-1]})")
    out = torch.zeros(len(answers), dtype=torch.float64)
    for p, row in enumerate(answers):
        voted = [(j, a.strip()) for j, a in enumerate(row[:k]) if a is not None]
        if voted:
            votes = Counter(a for _, a in voted)  # counts in first-occurrence order
            winner = votes.most_common(1)[0][0]  # ties: the first encountered
            first = next(j for j, a in voted if a == winner)
            out[p] = float(bool(correct[p, first]))
    return out


def sample_metrics(rewards: torch.Tensor, response_lengths: torch.Tensor,
                   truncated: torch.Tensor) -> dict[str, Estimate]:
    """Mean accuracy, mean reward, response length and truncation rate of a set's samples.

    Args:
        rewards: float ``[P, n]`` (NaN = unscored: incorrect, reward 0).
        response_lengths: long ``[P, n]``, tokens.
        truncated: bool ``[P, n]``, cut by the length limit.

    Returns:
        ``accuracy`` (share of samples with reward >= :data:`CORRECT_REWARD`, which is the
        unbiased pass@1 for ``n`` samples), ``reward_mean``, ``response_len`` (tokens) and
        ``truncated_ratio``, each averaged per prompt first (see the module docstring).
    """
    correct = (rewards >= CORRECT_REWARD).double()
    return {"accuracy": estimate(correct.mean(1)),
            "reward_mean": estimate(torch.nan_to_num(rewards.double(), nan=0.0).mean(1)),
            "response_len": estimate(response_lengths.double().mean(1)),
            "truncated_ratio": estimate(truncated.double().mean(1))}
