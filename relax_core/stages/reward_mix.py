"""Composite rewards: several ``--reward`` scorers summed with ``--reward-weights``.

    --reward a --reward b --reward-weights 1,0.5      r_i = 1 · r_i^a + 0.5 · r_i^b

Each scorer runs as a single one does (its own pass over the reward worker pool, with
``--reward-timeout`` and error counting: :func:`relax_core.stages.rewarding.score_batch`); a
sample that any of them cannot score (``None``: an error, a timeout, or "cannot score") is
unscored (NaN), never scored as if that part were 0.  The estimator, the post-processors
and the sampler see the weighted sum (``rollout/raw_reward`` is its mean); each part is
logged as ``rollout/reward/<name>``, the mean over the samples it scored.  Weights default
to 1 each.  ``relax eval`` scores with the first ``--reward`` (the task's own scorer).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

#: Score metrics that are counts: summed over the sampling rounds of a step (the others,
#: per-part means, are averaged over them: :func:`step_metrics`).
COUNTS = ("rollout/reward_errors", "rollout/reward_timeouts")


def is_count(key: str) -> bool:
    """Whether a score metric is a count: :data:`COUNTS`, or a scorer's own count
    ``rollout/reward/<name>/<count>`` (``RewardScorerSpec.counts``; the per-part means are
    ``rollout/reward/<name>``)."""
    return key in COUNTS or (key.startswith("rollout/reward/") and key.count("/") == 3)


def is_composite(cfg: Any) -> bool:
    """Whether the run has several ``--reward``: then the reward stage also gives each one's
    reward (the batch field ``reward_parts``) and logs each one's mean."""
    return len(cfg.reward) > 1


def weights(cfg: Any) -> tuple[float, ...]:
    """``--reward-weights``, or 1 for each ``--reward``."""
    return tuple(cfg.reward_weights) or (1.0,) * len(cfg.reward)


class Combined(list):
    """The weighted sums of :func:`combine` (a list of ``B`` floats or ``None``), with the
    ``parts`` they were summed from (``J`` lists of ``B``): the reward stage stores them as the
    batch field ``reward_parts`` ``[B, J]`` for estimators that normalise each reward on its
    own (``gdpo``)."""

    def __init__(self, sums: Sequence[float | None], parts: Sequence[Sequence[float | None]]):
        super().__init__(sums)
        self.parts = [list(p) for p in parts]


def combine(parts: Sequence[Sequence[float | None]], w: Sequence[float]) -> Combined:
    """Per sample ``Σ_j w_j · parts[j][i]``; ``None`` where any part is ``None``.

    Args:
        parts: ``J`` lists of ``B`` rewards (one list per scorer, in ``--reward`` order).
        w: ``J`` weights.
    """
    return Combined([None if any(r is None for r in rs) else sum(wj * r for wj, r in zip(w, rs))
                     for rs in zip(*parts)], parts)


def part_metrics(names: Sequence[str], parts: Sequence[Sequence[float | None]]) -> dict[str, float]:
    """``rollout/reward/<name>``: each part's mean over the samples it scored (NaN if none)."""
    out = {}
    for name, rs in zip(names, parts):
        scored = [r for r in rs if r is not None]
        out[f"rollout/reward/{name}"] = sum(scored) / len(scored) if scored else math.nan
    return out


def step_metrics(rounds: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The score metrics of a step from those of its sampling rounds: counts
    (:func:`is_count`) summed, the per-part means averaged over the rounds (which are of
    equal size: :func:`relax_core.stages.rewarding.mean_over_rounds`)."""
    from relax_core.stages.rewarding import mean_over_rounds

    out = mean_over_rounds([{k: v for k, v in r.items() if not is_count(k)} for r in rounds])
    for k in dict.fromkeys([*COUNTS, *(k for r in rounds for k in r if is_count(k))]):
        out[k] = sum(r.get(k, 0.0) for r in rounds)
    return out


def problems(cfg: Any, advantage_terms: bool = False) -> list[tuple[str, str, str]]:
    """``(option, message, fix)`` for every inconsistency of ``--reward`` and
    ``--reward-weights`` (checked at startup, :mod:`relax_core.host.validation`).  Every
    weight 0 is refused unless a selected correction adds an ``advantage_term``
    (``advantage_terms``): that is pure on-policy distillation, the rewards still scored and
    logged (``rollout/reward/<name>``) but every reward 0 (docs/guide/distillation.md)."""
    out = []
    names, w = tuple(cfg.reward), tuple(cfg.reward_weights)
    if not names:
        out.append(("--reward", "no reward scorer is given", "give --reward NAME (or leave the default, auto)"))
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        out.append(("--reward", f"{', '.join(dup)} given more than once", "give each --reward once (weigh it with "
                    "--reward-weights instead)"))
    if w and len(w) != len(names):
        out.append(("--reward-weights", f"{len(w)} weight(s) ({', '.join(f'{x:g}' for x in w)}) for {len(names)} "
                    f"--reward scorer(s) ({', '.join(names)})",
                    f"give one weight per --reward, in their order (e.g. --reward-weights {','.join(['1'] * len(names))})"))
    bad = [x for x in w if not math.isfinite(x)]
    if bad:
        out.append(("--reward-weights", f"non-finite weight(s) {', '.join(map(str, bad))}", "give finite numbers"))
    elif w and all(x == 0 for x in w) and not advantage_terms:
        out.append(("--reward-weights", "every weight is 0: every reward would be 0",
                    "give a non-zero weight (every weight 0 is pure distillation: add --correction opd "
                    "--teacher-model PATH)"))
    return out
