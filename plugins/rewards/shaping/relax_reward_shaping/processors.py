"""Reward post-processors: ``process(RewardBatch) -> RewardBatch`` (whole batch, vectorised).

Conventions (:class:`relax_core.contracts.RewardBatch`): ``rewards`` float ``[B]`` with NaN
for unscored samples (a processor never turns NaN into a number: NaN + x = NaN, and
``clamp`` keeps NaN), ``response_lengths`` long ``[B]`` in tokens, ``group_index`` long
``[B]`` (groups by id, never by position), ``keep`` bool ``[B]``.  The output rewards keep
the input dtype.  Each adds its metrics (python floats) to ``metrics``.

Overlong penalty, DAPO (Yu et al. 2025) §3.4 eq. (13), with L_max = ``max_len``,
L_cache = ``buffer_len`` and |y| the response length::

    R_length(y) = 0                              |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache     L_max - L_cache < |y| <= L_max
                = -1                             L_max < |y|
                = clamp(((L_max - L_cache) - |y|) / L_cache, -1, 0)   (one expression)

scaled by ``penalty_factor`` and added to the reward.  L_max = 20, L_cache = 4: lengths
16 → 0, 18 → -0.5, 20 → -1, 25 → -1.

Dynamic sampling, DAPO §3.2 eq. (11): keep only groups with 0 < |{correct}| < G, i.e.
(generalised to real-valued rewards) whose rewards are not all equal: max - min > eps
over the scored samples of the group.  The test is on the **raw** reward (the scorer's,
``RewardBatch.raw_rewards``), wherever the filter stands among the processors: placed after
an overlong or length penalty, a filter of the shaped reward would keep an all-wrong group
of mixed lengths (its penalties differ), whose only signal is "be shorter" (NeMo-RL issue
#2431).  A group with fewer than two scored samples carries
no signal either and is dropped.  Metric ``rollout/filtered_group_frac`` = dropped groups /
groups in the batch.  The training loop refills the batch by sampling more prompts, up to
``--max-oversampling-rounds``, and reports the metric over every group generated in the step
(the mean over its rounds, which are of equal size).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from relax_core.contracts import RewardBatch


def _finite_mean(x: torch.Tensor) -> float:
    x = x[torch.isfinite(x)]
    return float(x.double().mean()) if x.numel() else 0.0


@dataclass(frozen=True)
class OverlongPenalty:
    """DAPO soft overlong punishment (see the module docstring)."""

    max_len: int
    buffer_len: int
    penalty_factor: float = 1.0

    def __post_init__(self):
        if not 1 <= self.buffer_len <= self.max_len:
            raise ValueError(f"--overlong-buffer-len {self.buffer_len} must be in [1, --overlong-max-len {self.max_len}]")

    def penalty(self, lengths: torch.Tensor) -> torch.Tensor:
        """float32 ``[B]`` penalty (<= 0) for response lengths ``[B]`` (tokens)."""
        start = self.max_len - self.buffer_len
        ramp = (start - lengths.to(torch.float32)) / self.buffer_len
        return ramp.clamp(min=-1.0, max=0.0) * self.penalty_factor

    def process(self, batch: RewardBatch) -> RewardBatch:
        pen = self.penalty(batch.response_lengths)                       # [B]
        rewards = (batch.rewards.to(torch.float32) + pen).to(batch.rewards.dtype)
        return batch.replace(rewards=rewards, metrics={
            **batch.metrics,
            "rollout/overlong_penalty_mean": float(pen.mean()) if pen.numel() else 0.0,
            "rollout/overlong_penalized_frac": float((pen < 0).float().mean()) if pen.numel() else 0.0,
        })


@dataclass(frozen=True)
class FormatReward:
    """Adds ``bonus`` where the response matches ``pattern`` (``re.search``, DOTALL),
    ``penalty`` elsewhere."""

    pattern: str
    bonus: float = 0.0
    penalty: float = -0.5

    def __post_init__(self):
        try:
            re.compile(self.pattern)
        except re.error as e:
            raise ValueError(f"--format-pattern {self.pattern!r} is not a valid regular expression: {e}") from None

    def process(self, batch: RewardBatch) -> RewardBatch:
        rx = re.compile(self.pattern, re.DOTALL)
        matched = torch.tensor([rx.search(r) is not None for r in batch.responses], dtype=torch.bool)  # [B]
        shift = torch.where(matched, torch.tensor(self.bonus), torch.tensor(self.penalty))
        rewards = (batch.rewards.to(torch.float32) + shift).to(batch.rewards.dtype)
        return batch.replace(rewards=rewards, metrics={
            **batch.metrics, "rollout/format_match_frac": float(matched.float().mean()) if matched.numel() else 0.0})


@dataclass(frozen=True)
class LengthPenalty:
    """Subtracts ``coef`` × response length (tokens) from each reward."""

    coef: float

    def process(self, batch: RewardBatch) -> RewardBatch:
        pen = self.coef * batch.response_lengths.to(torch.float32)       # [B]
        rewards = (batch.rewards.to(torch.float32) - pen).to(batch.rewards.dtype)
        return batch.replace(rewards=rewards, metrics={
            **batch.metrics, "rollout/length_penalty_mean": float(pen.mean()) if pen.numel() else 0.0})


@dataclass(frozen=True)
class Clip:
    """Clamps rewards to ``[low, high]`` (NaN stays NaN)."""

    low: float
    high: float

    def __post_init__(self):
        if not self.low <= self.high:
            raise ValueError(f"--reward-clip-min {self.low} must be <= --reward-clip-max {self.high}")

    def process(self, batch: RewardBatch) -> RewardBatch:
        r = batch.rewards
        clipped = (r < self.low) | (r > self.high)
        return batch.replace(rewards=r.clamp(self.low, self.high), metrics={
            **batch.metrics, "rollout/reward_clip_frac": float(clipped.float().mean()) if r.numel() else 0.0})


@dataclass(frozen=True)
class ZeroVarianceFilter:
    """DAPO dynamic-sampling filter: clears ``keep`` for the groups whose raw rewards are all
    equal, in any position among the processors (module docstring)."""

    eps: float = 1e-6

    def zero_variance_groups(self, rewards: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(dropped [G] bool, inverse [B] long)``: per group (in ``torch.unique`` order),
        whether it has no spread, and each sample's group position."""
        _, inverse = torch.unique(group_index, return_inverse=True)      # [B] in 0..G-1
        g = int(inverse.max()) + 1 if inverse.numel() else 0
        r = rewards.to(torch.float64)
        scored = torch.isfinite(r)                                       # [B]
        inf = float("inf")
        hi = torch.full((g,), -inf, dtype=torch.float64).scatter_reduce(
            0, inverse, torch.where(scored, r, -inf), "amax")            # [G] max of scored rewards
        lo = torch.full((g,), inf, dtype=torch.float64).scatter_reduce(
            0, inverse, torch.where(scored, r, inf), "amin")             # [G] min of scored rewards
        n_scored = torch.zeros(g, dtype=torch.long).scatter_add(0, inverse, scored.long())            # [G]
        dropped = (n_scored < 2) | (hi - lo <= self.eps)
        return dropped, inverse

    def process(self, batch: RewardBatch) -> RewardBatch:
        dropped, inverse = self.zero_variance_groups(batch.raw_rewards, batch.group_index)
        keep = batch.keep & ~dropped[inverse]                              # [B]
        frac = float(dropped.float().mean()) if dropped.numel() else 0.0
        return batch.replace(keep=keep, metrics={**batch.metrics, "rollout/filtered_group_frac": frac})


def build_overlong(params: Any, config: Any) -> OverlongPenalty:
    max_len = params.max_len if params.max_len is not None else getattr(config, "rollout_max_response_len", None)
    if max_len is None:
        raise ValueError("overlong_penalty needs --overlong-max-len (or a run config's --rollout-max-response-len)")
    buffer_len = params.buffer_len if params.buffer_len is not None else max(1, max_len // 5)
    return OverlongPenalty(max_len=max_len, buffer_len=buffer_len, penalty_factor=params.penalty_factor)


def build_format(params: Any, config: Any) -> FormatReward:
    return FormatReward(params.pattern, params.bonus, params.penalty)


def build_length_penalty(params: Any, config: Any) -> LengthPenalty:
    return LengthPenalty(params.coef)


def build_clip(params: Any, config: Any) -> Clip:
    return Clip(params.min, params.max)


def build_zero_variance_filter(params: Any, config: Any) -> ZeroVarianceFilter:
    return ZeroVarianceFilter(params.eps)
